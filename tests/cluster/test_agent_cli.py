"""``python -m dsec.cluster.agent``: a node agent in the foreground for gateways started
with ``--node URL``. Real parts: the container backend (runc), the node's own API on
loopback, spoken to with the cluster credential as a gateway does."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from dsec.node.host.mounts import mounts_under
from tests.support.server import leftovers

CREDENTIAL = "dsec_test_agent_cli_credential"


def _start(root: Path, seen: int = 0) -> tuple[subprocess.Popen, str]:
    log = open(root / "agent.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "dsec.cluster.agent", "--state-dir",
                             str(root / "node"), "--cluster-token-file",
                             str(root / "cluster_token")],
                            stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        lines = (root / "agent.log").read_text().splitlines()
        urls = [json.loads(x)["url"] for x in lines if x.startswith('{"node_id"')]
        if len(urls) > seen:
            return proc, urls[-1]
        assert proc.poll() is None, (root / "agent.log").read_text()[-2000:]
        time.sleep(0.1)
    raise AssertionError("the node agent did not announce its URL")


def _end(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(60)


@pytest.fixture
def root(tmp_path):
    (tmp_path / "cluster_token").write_text(CREDENTIAL + "\n")
    os.chmod(tmp_path / "cluster_token", 0o600)
    yield tmp_path
    from dsec.images import ImageService
    from dsec.node.host.mounts import mounts_under, umount
    ImageService(tmp_path / "node").unmount_all()
    for target in mounts_under(tmp_path / "node"):
        umount(target)


def test_sandboxes_outlive_the_agent_and_answer_its_successor(root):
    proc, url = _start(root)
    auth = {"authorization": f"Bearer {CREDENTIAL}"}
    try:
        with httpx.Client(base_url=url, headers=auth, timeout=60) as http:
            assert http.get("/v1/sandboxes", headers={"authorization": "Bearer x"}
                            ).status_code == 401  # only the cluster credential
            r = http.post("/v1/sandboxes", json={"memory_mb": 64})
            assert r.status_code == 201, r.text
            sb = r.json()["id"]
            r = http.post(f"/v1/sandboxes/{sb}/exec", json={"cmd": ["sh", "-c", "echo $$ > /pid"]})
            assert r.json()["exit_code"] == 0
        assert _end(proc) == 0  # SIGTERM: a clean end, sandboxes left running
        state = json.loads(subprocess.run(
            ["runc", "--root", str(root / "node" / "runc"), "state", sb],
            capture_output=True, text=True, check=True).stdout)
        assert state["status"] == "running"
        proc2, url2 = _start(root, seen=1)
        try:
            with httpx.Client(base_url=url2, headers=auth, timeout=60) as http:
                assert http.get(f"/v1/sandboxes/{sb}").json()["state"] == "running"
                r = http.post(f"/v1/sandboxes/{sb}/exec", json={"cmd": ["cat", "/pid"]})
                assert r.json()["exit_code"] == 0 and r.json()["stdout"].strip()
                assert http.delete(f"/v1/sandboxes/{sb}").status_code in (200, 204)
        finally:
            assert _end(proc2) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not leftovers(root / "node")


def test_no_credential_is_refused_at_once(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "DSEC_CLUSTER_TOKEN"}
    r = subprocess.run([sys.executable, "-m", "dsec.cluster.agent", "--state-dir",
                        str(tmp_path / "node")], capture_output=True, text=True, env=env,
                       timeout=60)
    assert r.returncode == 2
    assert "cluster credential is required" in r.stderr
    r = subprocess.run([sys.executable, "-m", "dsec.cluster.agent", "--state-dir",
                        str(tmp_path / "node"), "--cluster-token-file",
                        str(tmp_path / "missing")], capture_output=True, text=True, env=env,
                       timeout=60)
    assert r.returncode == 2, r.stderr
    assert "cannot read the cluster credential" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "node").exists()  # nothing opened


def test_a_taken_port_ends_it_with_nothing_left_mounted(root):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        r = subprocess.run([sys.executable, "-m", "dsec.cluster.agent", "--state-dir",
                            str(root / "node"), "--cluster-token-file",
                            str(root / "cluster_token"), "--port",
                            str(taken.getsockname()[1])],
                           capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "address already in use" in r.stderr
    assert not mounts_under(root / "node")  # its sandboxes dir was a mount of its own


def test_the_gateways_first_start_message_names_flags_the_node_clis_take(tmp_path, capsys,
                                                                          monkeypatch):
    """It once told people to start node agents with --cluster-token, which only
    dsec.cluster.ray takes; dsec.cluster.agent takes --cluster-token-file."""
    import re

    from dsec.cluster import agent, ray
    from dsec.gateway.server import cluster_credential
    monkeypatch.delenv("DSEC_CLUSTER_TOKEN", raising=False)
    cluster_credential(tmp_path)
    said = capsys.readouterr().out
    named = re.findall(r"python -m (dsec\.cluster\.\w+) (--[\w-]+)", said)
    assert {m for m, _ in named} == {"dsec.cluster.agent", "dsec.cluster.ray"}, said
    for module, flag in named:
        with pytest.raises(SystemExit):
            {"dsec.cluster.agent": agent, "dsec.cluster.ray": ray}[module].main(["--help"])
        assert flag in capsys.readouterr().out, (module, flag)
