"""A gateway process over node agent processes (``python -m dsec.cluster.agent``), each
with the container backend and its own state dir: the cluster mode as it is deployed
without Ray, for tests that need sandboxes on more than one real node."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.support.server import ServerProcess, leftovers

__all__ = ["AgentCluster"]


@dataclass
class AgentCluster:
    """The gateway's URL and root token, the cluster credential and each node's URL
    (by its short id, the middle part of its sandboxes' ids)."""

    url: str
    token: str
    cluster_token: str
    nodes: dict[str, str] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)  # each node agent's process

    def node_of(self, sb_id: str) -> str:
        return sb_id.split("-")[1]


def _start_agent(root: Path, credential: Path) -> tuple[subprocess.Popen, str]:
    root.mkdir(parents=True)
    log = open(root / "agent.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "dsec.cluster.agent", "--state-dir",
                             str(root / "node"), "--cluster-token-file", str(credential)],
                            stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for line in (root / "agent.log").read_text().splitlines():
            if line.startswith('{"node_id"'):
                return proc, json.loads(line)["url"]
        assert proc.poll() is None, (root / "agent.log").read_text()[-2000:]
        time.sleep(0.1)
    raise AssertionError("the node agent did not announce its URL")


def _end_agent(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_for_nodes(url: str, token: str, count: int) -> dict[str, str]:
    deadline = time.monotonic() + 60
    with httpx.Client(base_url=url, headers={"authorization": f"Bearer {token}"},
                      timeout=30) as http:
        while time.monotonic() < deadline:
            nodes = http.get("/v1/nodes").json()
            if sum(1 for n in nodes if n["healthy"]) == count:
                return {n["id"].removeprefix("node-"): n["id"] for n in nodes}
            time.sleep(0.2)
    raise AssertionError(f"the gateway did not see {count} healthy nodes: {nodes}")


@pytest.fixture(scope="module")
def agents(tmp_path_factory):
    """A gateway process over two node agent processes."""
    base = tmp_path_factory.mktemp("agents")
    gw_dir = base / "gateway"
    gw_dir.mkdir()
    credential = gw_dir / "cluster_token"
    credential.write_text("dsec_test_agents_" + os.urandom(8).hex() + "\n")
    os.chmod(credential, 0o600)
    procs, urls = [], {}
    gateway = None
    try:
        for i in range(2):
            proc, url = _start_agent(base / f"n{i}", credential)
            procs.append(proc)
            urls[i] = url
        extra = [arg for u in urls.values() for arg in ("--node", u)]
        gateway = ServerProcess(state_dir=gw_dir, extra_args=extra).start()
        ids = _wait_for_nodes(gateway.url, gateway.token, len(procs))
        by_url, pids = {}, {}
        for i, url in urls.items():
            r = httpx.get(f"{url}/v1/nodes/load", timeout=30,
                          headers={"authorization": f"Bearer {credential.read_text().strip()}"})
            short = r.json()[0]["node_id"].removeprefix("node-")
            by_url[short], pids[short] = url, procs[i].pid
        assert set(by_url) == set(ids)
        yield AgentCluster(gateway.url, gateway.token, credential.read_text().strip(), by_url,
                           pids)
    finally:
        if gateway is not None:
            gateway.destroy()  # stops every sandbox through the gateway first
        for proc in procs:
            _end_agent(proc)
        from dsec.images import ImageService
        from dsec.node.host.mounts import mounts_under, umount
        left = []
        for i in range(len(procs)):
            state = base / f"n{i}" / "node"
            left += leftovers(state)
            ImageService(state).unmount_all()
            for target in mounts_under(state):
                umount(target)
        assert not left, left
