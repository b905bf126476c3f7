"""A cluster with no Ray, as a user starts it from the CLI: ``dsec node --listen`` (the node
agent in the foreground) and ``dsec serve --node URL`` (a gateway over it); ``dsec nodes``
through the gateway shows the node, then shows it lost once its agent ended. Real parts: the
container backend (runc), both processes on loopback."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import httpx

import dsec
from tests.cli.conftest import DSEC, run_cli
from tests.support.server import free_port, leftovers


def _wait(what: str, ok, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if got := ok():
                return got
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout:.0f} s")


def test_node_listen_and_serve_node_make_a_cluster(tmp_path):
    gw_dir, node_dir = tmp_path / "gw", tmp_path / "node"
    gw_port, node_port = free_port(), free_port()
    node_url, gw_url = f"http://127.0.0.1:{node_port}", f"http://127.0.0.1:{gw_port}"
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("DSEC_CLUSTER_TOKEN", None)
    logs = open(tmp_path / "procs.log", "ab")
    gw = subprocess.Popen([*DSEC, "serve", "--state-dir", str(gw_dir), "--port", str(gw_port),
                           "--node", node_url], env=env, stdout=logs, stderr=logs,
                          start_new_session=True)
    agent = None
    try:
        credential = _wait("the gateway's cluster credential", lambda: (
            gw_dir / "cluster_token").exists() and (gw_dir / "cluster_token").read_text().strip())
        agent = subprocess.Popen([*DSEC, "node", "--listen", f"127.0.0.1:{node_port}",
                                  "--state-dir", str(node_dir)],
                                 env={**env, "DSEC_CLUSTER_TOKEN": credential}, stdout=logs,
                                 stderr=logs, start_new_session=True)
        assert credential not in " ".join(agent.args)  # not on a command line ps shows
        token = _wait("the gateway's token", lambda: (gw_dir / "token").exists()
                      and (gw_dir / "token").read_text().strip())
        user = {**env, "DSEC_URL": gw_url, "DSEC_TOKEN": token}
        _wait("the gateway sees the node", lambda: httpx.get(
            f"{gw_url}/healthz", timeout=5).json() == {"ok": True, "nodes": 1, "unhealthy": []})
        with dsec.Client(gw_url, token) as client:
            sb = client.create(memory_mb=64)
            assert sb.exec(["echo", "relayed"]).stdout == "relayed\n"
            r = run_cli(user, "nodes")
            assert r.returncode == 0, r.stderr
            row = r.stdout.splitlines()[1].split()
            assert row[0] == f"node-{sb.id.split('-')[1]}" and row[1] == "ok"
            sb.stop()
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(60) == 0
        r = _wait("dsec nodes shows the node lost", lambda: (
            x := run_cli(user, "nodes")) and "lost" in x.stdout and x)
        assert r.returncode == 0
        assert "lost:" in r.stderr  # why, on stderr: stdout stays the table
    finally:
        for p in (agent, gw):
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(60)
    assert not leftovers(node_dir), (tmp_path / "procs.log").read_text()[-3000:]
