"""dsec serve starts a server that the other commands find through its state directory."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

import httpx

from dsec.images import ImageService
from tests.cli.conftest import DSEC, run_cli
from tests.support.server import free_port


def test_serve_then_use_it_through_the_state_dir(tmp_path):
    state = tmp_path / "state"
    port = free_port()
    log = open(tmp_path / "serve.log", "w+")
    server = subprocess.Popen([*DSEC, "serve", "--port", str(port), "--state-dir", str(state)],
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120  # a hang guard, not a speed bound
        while True:
            assert server.poll() is None, open(tmp_path / "serve.log").read()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, open(tmp_path / "serve.log").read()
            time.sleep(0.1)
        assert (state / "token").stat().st_mode & 0o777 == 0o600

        env = {k: v for k, v in os.environ.items() if k not in ("DSEC_URL", "DSEC_TOKEN")}
        env["DSEC_STATE_DIR"] = str(state)
        r = run_cli(env, "images")
        assert r.returncode == 0, r.stderr
        assert "busybox:latest" in r.stdout
        r = run_cli({**env, "DSEC_STATE_DIR": str(tmp_path / "elsewhere"),
                     "DSEC_URL": f"http://127.0.0.1:{port}"}, "ls")
        assert r.returncode == 1 and "bearer token" in r.stderr  # no token, no entry

        server.send_signal(signal.SIGTERM)
        assert server.wait(60) in (0, -signal.SIGTERM)  # uvicorn re-raises it after shutdown
        output = open(tmp_path / "serve.log").read()
        assert f"DSEC_STATE_DIR={state}" in output and "new API token" in output
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        log.close()
        ImageService(state).unmount_all()
        shutil.rmtree(state, ignore_errors=True)


def test_node_takes_the_cluster_credential_not_the_users_token(tmp_path):
    """`dsec node` must not pass a user's DSEC_TOKEN off as the cluster credential: the
    node would refuse every gateway holding the real one."""
    env = {k: v for k, v in os.environ.items() if k != "DSEC_CLUSTER_TOKEN"}
    env.update(DSEC_TOKEN="dsec_a_users_token", RAY_ADDRESS="127.0.0.1:1")
    r = run_cli(env, "node", "--state-dir", str(tmp_path), timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "DSEC_CLUSTER_TOKEN" in r.stderr and "cluster_token" in r.stderr
