"""A gateway over a fixed list of node URLs (StaticCluster), over simulated node agents in
this process: real HTTP on loopback, each node its own server and port."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time

import httpx
import pytest

import dsec

from dsec.cluster.simulated import SimulatedNodes, route_of
from dsec.cluster.static import StaticCluster
from dsec.gateway.app import create_app
from dsec.gateway.watcher import Watcher

TOKEN = "dsec_test_static"       # the cluster credential: gateway -> node
ROOT = "dsec_test_static_root"   # the gateway's root token: user -> gateway
NODES = 5


@contextlib.asynccontextmanager
async def _gateway(urls: list[str], period_s: float = 0.2, seen: list | None = None):
    """A gateway over ``urls`` on loopback; its app is appended to ``seen``."""
    import uvicorn
    watcher_cluster = StaticCluster(urls, TOKEN)
    watcher = Watcher(watcher_cluster, period_s=period_s, stale_after_s=max(1.0, 5 * period_s))
    app = create_app(watcher_cluster, ROOT, watcher=watcher)
    if seen is not None:
        seen.append(app)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    server.capture_signals = contextlib.nullcontext  # pytest keeps its own handlers
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    async with httpx.AsyncClient(base_url=url, timeout=10,
                                 headers={"authorization": f"Bearer {ROOT}"}) as http:
        try:
            yield http
        finally:
            server.should_exit = True
            await task


@pytest.fixture
async def nodes(tmp_path):
    nodes = SimulatedNodes(tmp_path, NODES, TOKEN)
    await nodes.start()
    yield nodes
    urls = nodes.urls
    await nodes.close()
    assert all(n.task.done() for n in nodes.nodes)
    assert all(not n.node.records for n in nodes.nodes[1:])  # stopped; node 0 was killed
    for url in urls:  # every port closed
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/healthz", timeout=1)
    await asyncio.sleep(0)
    left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
    assert not left, left


def test_route_of_names_the_route_not_the_sandbox():
    assert route_of("POST", "/v1/sandboxes/sb-1a2b3c4d-00ff00ff00ff/exec") == \
        "POST /v1/sandboxes/{id}/exec"
    assert route_of("GET", "/v1/nodes/load") == "GET /v1/nodes/load"


async def test_a_batch_is_split_over_every_node_with_one_request_each(nodes):
    async with _gateway(nodes.urls) as gw:
        before = nodes.counts()
        r = await gw.post("/v1/sandboxes/batch",
                          json={"count": 50, "spec": {"cpu": 0.05, "memory_mb": 64}})
        assert r.status_code == 201, r.text
        body = r.json()
        assert len(body["sandboxes"]) == 50 and body["errors"] == []
        assert sorted(nodes.sandboxes().values()) == [10] * NODES
        after = nodes.counts()
        for node_id, c in after.items():
            assert c.get("POST /v1/sandboxes/batch", 0) \
                - before[node_id].get("POST /v1/sandboxes/batch", 0) == 1
        one = body["sandboxes"][0]["id"]
        got = await gw.get(f"/v1/sandboxes/{one}")
        assert got.status_code == 200 and got.json()["state"] == "running"
        ran = await gw.post(f"/v1/sandboxes/{one}/exec", json={"cmd": ["true"]})
        assert ran.status_code == 200 and ran.json()["exit_code"] == 0
        other = await gw.post(f"/v1/sandboxes/{one}/exec", json={"cmd": "ls /"})
        assert other.status_code == 400 and other.json()["error"]["code"] == "unsupported"


async def test_a_create_answer_shows_the_gateway_what_other_gateways_placed_there(nodes):
    """Between two probes, a gateway learns what a node holds from the node's answers to
    its own creates, the other gateways' placements on it included: several gateways at
    once so do not all pile onto the node that looked emptiest a period ago."""
    seen: list = []
    async with _gateway(nodes.urls, period_s=60.0, seen=seen) as gw:
        gateway = seen[0].state.gateway
        watcher = gateway.watcher
        assert {v.load.sandboxes for v in watcher.views.values()} == {0}  # its first probe
        spec = {"cpu": 0.05, "memory_mb": 64}
        async with httpx.AsyncClient(timeout=10, headers={
                "authorization": f"Bearer {TOKEN}"}) as other:  # as another gateway would
            for url in nodes.urls:
                for _ in range(3):
                    r = await other.post(f"{url}/v1/sandboxes", json=spec)
                    assert r.status_code == 201, r.text
                    node_load = r.headers["x-dsec-node-load"].split()
            assert node_load[:2] == ["3", str(3 * 64)]  # the last node's, after its third
        r = await gw.post("/v1/sandboxes", json=spec)
        assert r.status_code == 201, r.text
        there = watcher.view(r.json()["node"])
        assert there.load.sandboxes == 4  # the other gateway's 3, and its own
        assert there.load.memory_reserved_mb == 4 * 64
        assert watcher.pending.counts().get(there.node_id, 0) == 0  # no double count
        assert sorted(v.load.sandboxes for v in watcher.views.values()) == [0] * (NODES - 1) + [4]
        # the project ledger is reconciled against the probes' own counts: the create's
        # answer, which its ledger row is confirmed after, has no node listed
        before = nodes.counts()
        await gateway.projects.reconcile(gateway)
        assert [c.get("GET /v1/sandboxes", 0) for c in nodes.counts().values()] == \
            [c.get("GET /v1/sandboxes", 0) for c in before.values()]


async def test_a_killed_node_is_marked_and_its_sandboxes_answer_node_lost(nodes):
    async with _gateway(nodes.urls) as gw:
        r = await gw.post("/v1/sandboxes/batch",
                          json={"count": 10, "spec": {"cpu": 0.05, "memory_mb": 64,
                                                      "job": "j1"}})
        victim = nodes.nodes[0].node.node_id
        theirs = [s["id"] for s in r.json()["sandboxes"] if s["node"] == victim]
        assert theirs
        await nodes.kill(0)
        t0 = time.monotonic()
        while victim not in (await gw.get("/healthz")).json()["unhealthy"]:
            assert time.monotonic() - t0 < 5, "the watcher did not mark the killed node"
            await asyncio.sleep(0.05)
        t1 = time.perf_counter()
        lost = await gw.get(f"/v1/sandboxes/{theirs[0]}")
        assert time.perf_counter() - t1 < 0.5
        assert lost.status_code == 503 and lost.json()["error"]["code"] == "node_lost"
        assert victim in lost.json()["error"]["message"]
        more = await gw.post("/v1/sandboxes/batch",
                             json={"count": 8, "spec": {"cpu": 0.05, "memory_mb": 64}})
        assert more.status_code == 201 and len(more.json()["sandboxes"]) == 8
        assert victim not in {s["node"] for s in more.json()["sandboxes"]}
        listed = (await gw.get("/v1/sandboxes")).json()
        assert listed["unreachable"] == [victim]
        shown = {n["id"]: n for n in (await gw.get("/v1/nodes")).json()}
        assert set(shown) == {n.node.node_id for n in nodes.nodes}  # the lost one too
        assert shown[victim]["healthy"] is False and shown[victim]["running"] is None
        assert "last answered" in shown[victim]["problem"]
        other = next(n for i, n in shown.items() if i != victim)
        assert shown[victim]["backends"] == other["backends"]  # its last answer's figures
        assert all(n["healthy"] and n["problem"] is None
                   for i, n in shown.items() if i != victim)
        # the job verbs fan out too, and name the node they could not reach
        jobs = (await gw.get("/v1/jobs")).json()
        assert jobs["unreachable"] == [victim]
        j1 = (await gw.get("/v1/jobs/j1")).json()
        assert j1["unreachable"] == [victim] and j1["sandboxes"] == 10 - len(theirs)
        stopped = await gw.delete("/v1/jobs/j1")
        assert stopped.status_code == 503 and victim in stopped.json()["error"]["message"]
        # the SDK says so too: list() names them, stop_all() raises after the others
        async with dsec.AsyncClient(str(gw.base_url), ROOT) as client:
            assert (await client.list()).unreachable == [victim]
            assert (await client.jobs.list()).unreachable == [victim]
            with pytest.raises(dsec.NodeLost, match=f"stopped 8 sandboxes.*{victim}"):
                await client.stop_all()


async def test_a_node_takes_only_the_cluster_credential_and_the_gateway_scopes_it(nodes):
    async with _gateway(nodes.urls) as gw:
        r = await gw.post("/v1/projects", json={"path": "team"})
        assert r.status_code == 201, r.text
        made = await gw.post("/v1/projects/tokens", params={"path": "team"}, json={})
        user = made.json()["token"]
        mine = await gw.post("/v1/sandboxes", json={"cpu": 0.05, "memory_mb": 64},
                             headers={"authorization": f"Bearer {user}"})
        assert mine.status_code == 201 and mine.json()["project"] == "team"
        root_sb = await gw.post("/v1/sandboxes", json={"cpu": 0.05, "memory_mb": 64})
        theirs = root_sb.json()["id"]
        # the project is carried over the hop to the node, which enforces it
        got = await gw.get(f"/v1/sandboxes/{theirs}", headers={"authorization": f"Bearer {user}"})
        assert got.status_code == 404
        url = nodes.urls[0]
        async with httpx.AsyncClient(base_url=url, timeout=10) as node:
            for token in (user, ROOT, None):
                headers = {"authorization": f"Bearer {token}"} if token else {}
                r = await node.get("/v1/sandboxes", headers=headers)
                assert r.status_code == 401, token
                assert "cluster credential" in r.json()["error"]["message"]
            ok = await node.get("/v1/sandboxes", headers={"authorization": f"Bearer {TOKEN}",
                                                          "x-dsec-project": "team"})
            assert ok.status_code == 200
            assert {s["project"] for s in ok.json()["sandboxes"]} <= {"team"}
        # a user sending the scope header to the gateway changes nothing
        forged = await gw.get(f"/v1/sandboxes/{theirs}",
                              headers={"authorization": f"Bearer {user}", "x-dsec-project": ""})
        assert forged.status_code == 404
