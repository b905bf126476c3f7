"""Schemathesis against a cluster gateway's /openapi.json: every route relayed to a real
node agent over HTTP (issue 15's one gateway app over HttpNodeClient), with the same checks
as the embedded server's fuzz (tests/support/fuzz.py): no request it generates, valid or
not, may get a server error or an error without the structured body; afterwards the list
answers through the gateway and no sandbox exists that no caller was given.

Real parts: a node agent with the container backend (runc) in a process of its own
(``python -m dsec.cluster.agent``), a gateway process over its URL (``dsec.gateway.server
--node URL``), both on loopback, sharing the cluster credential.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support import fuzz
from tests.support.fuzz import http, live  # noqa: F401  (fixtures)
from tests.support.server import ServerProcess, leftovers

pytestmark = pytest.mark.timeout(900)
RECOVER_S = 30.0  # how long a stalled node may take to answer the watcher again


@pytest.fixture(scope="module")
def node_agent(tmp_path_factory):
    root = tmp_path_factory.mktemp("relay-fuzz")
    credential = "dsec_fuzz_cluster_" + secrets.token_hex(8)
    (root / "cluster_token").write_text(credential)
    os.chmod(root / "cluster_token", 0o600)
    state = root / "node"
    log = open(root / "node.log", "wb")  # stdout too: a pipe nobody reads fills and stops it
    proc = subprocess.Popen([sys.executable, "-m", "dsec.cluster.agent", "--state-dir",
                             str(state), "--cluster-token-file", str(root / "cluster_token")],
                            stdout=log, stderr=log, start_new_session=True)
    try:
        url = _announced(proc, root / "node.log")
        yield {"url": url, "credential": credential, "state": state,
               "log": root / "node.log"}
    finally:
        died = proc.poll()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log_tail = (root / "node.log").read_text(errors="replace")[-4000:]
        left = leftovers(state)
        from dsec.images import ImageService
        from dsec.node.host.mounts import mounts_under, umount
        ImageService(state).unmount_all()
        for target in mounts_under(state):
            umount(target)
        subprocess.run(["rm", "-rf", str(root)], check=False)
        assert died is None, f"the node agent died ({died}) during the fuzz: {log_tail}"
        assert not left, f"the fuzz left things behind on the node: {left}"


def _announced(proc: subprocess.Popen, log: Path, timeout: float = 120.0) -> str:
    """The URL the node agent printed once it answers (its first JSON line)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith('{"node_id"'):
                return json.loads(line)["url"]
        assert proc.poll() is None, f"the node agent ended: {log.read_text()[-2000:]}"
        time.sleep(0.1)
    raise AssertionError(f"the node agent did not answer in time: {log.read_text()[-2000:]}")


@pytest.fixture(scope="module")
def fuzzed(node_agent, tmp_path_factory):
    state = tmp_path_factory.mktemp("relay-fuzz-gw")
    (state / "cluster_token").write_text(node_agent["credential"])  # what it trusts nodes by
    os.chmod(state / "cluster_token", 0o600)
    srv = ServerProcess(state_dir=state, extra_args=["--node", node_agent["url"]]).start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # healthy before the node answered its probe
            h = httpx.get(f"{srv.url}/healthz", timeout=5).json()
            if h["nodes"] == 1 and not h["unhealthy"]:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"the gateway never saw the node: {h}")
        yield srv
    finally:
        try:
            srv.stop_all_sandboxes()
        finally:
            srv.stop()
            subprocess.run(["rm", "-rf", str(state)], check=False)


def test_no_relayed_request_gets_a_server_error(http, live, fuzzed, node_agent):
    stalls: list[float] = []

    def recover() -> bool:
        """The node marked unhealthy (on this shared 2-core machine a node agent has
        stalled past the watcher's 2 s probe timeout): wait for it to answer again."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < RECOVER_S:
            h = httpx.get(f"{fuzzed.url}/healthz", timeout=5).json()
            if not h["unhealthy"]:
                stalls.append(time.monotonic() - t0)
                return True
            time.sleep(0.2)
        return False

    failures = fuzz.fuzz_every_operation(fuzz.schema(fuzzed.url, fuzzed.token), http, live,
                                         fuzzed.token, recover=recover)
    if failures:
        failures.append("node agent log, last lines: "
                        + (node_agent["log"].read_text(errors="replace")[-3000:]))
    assert not failures, "\n\n".join(failures)
    assert len(stalls) <= 3, f"the node stalled {len(stalls)} times: {stalls}"


def test_afterwards_the_list_answers_and_no_sandbox_is_unreturned(http, live):
    """Runs after the fuzz (pytest keeps file order)."""
    left = fuzz.unreturned(http, live)
    assert not left, f"sandboxes no caller was given: {left}"
