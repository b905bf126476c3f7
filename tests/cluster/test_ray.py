"""A real three-node Ray cluster on this machine: three raylets, a node agent on each, and
gateways placing and relaying over HTTP. (All "machines" are this host: the only fake.)"""

import asyncio
import shutil
import socket
from collections import Counter
import tempfile
import threading
import time
from pathlib import Path

import pytest

import dsec
from tests.support.server import free_port

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def ray_cluster():
    from ray.cluster_utils import Cluster
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 1, "resources": {"machine-a": 1}})
    cluster.add_node(num_cpus=1, resources={"machine-b": 1})
    cluster.add_node(num_cpus=1, resources={"machine-c": 1})
    ray.init(address=cluster.address, namespace="dsec", log_to_driver=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


TOKEN = "dsec_test_cluster_token"


class Gateway:
    """A gateway process's app (a uvicorn server in a thread of this process)."""

    def __init__(self) -> None:
        import uvicorn

        from dsec.cluster.ray import RayCluster
        from dsec.gateway.app import create_app
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(
            create_app(RayCluster(TOKEN, refresh_s=0.5), TOKEN), host="127.0.0.1",
            port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def start_node(d: Path, machine: str):
    from dsec.cluster.ray import start_node_actor
    return start_node_actor(d, TOKEN, resources={f"machine-{machine}": 0.01})


@pytest.fixture(scope="module")
def gateway(ray_cluster):
    dirs = [Path(tempfile.mkdtemp(prefix="dsec-ray-")) for _ in range(3)]
    nodes = [start_node(d, m) for d, m in zip(dirs, "abc")]
    gw = Gateway()
    yield gw.url, TOKEN, nodes, dirs
    gw.stop()
    for n in nodes:
        ray.get(n.actor.shutdown.remote())
        ray.kill(n.actor)
    for d in dirs:
        assert not [p for p in (d / "sandboxes").iterdir()], "sandbox dirs left behind"
        shutil.rmtree(d, ignore_errors=True)


async def test_two_nodes_are_found(gateway):
    url, token, nodes, _ = gateway
    async with dsec.AsyncClient(url, token) as c:
        assert {n.id for n in await c.nodes()} == {n.node_id for n in nodes}


async def test_sandboxes_spread_and_requests_reach_their_node(gateway):
    url, token, nodes, _ = gateway
    async with dsec.AsyncClient(url, token) as c:
        sbs = await c.create_many(6, memory_mb=64, job="ray-job")
        try:
            placed = {s.info.node for s in sbs}
            assert placed == {n.node_id for n in nodes}, "placement should use both nodes"
            outs = await asyncio.gather(*(s.exec("hostname") for s in sbs))
            assert [o.stdout.strip() for o in outs] == [s.id for s in sbs]
            assert {i.id for i in await c.list(job="ray-job")} == {s.id for s in sbs}
            one = sbs[0]
            await one.files.write("/tmp/x", b"through the gateway")
            assert await one.files.read("/tmp/x") == b"through the gateway"
            events = [e async for e in one.exec_stream("echo a; echo b >&2")]
            assert events[-1].type == "exit"
            sh = await one.shell()
            await sh.run("cd /tmp")
            assert (await sh.run("pwd")).stdout == "/tmp\n"
        finally:
            await asyncio.gather(*(s.stop() for s in sbs))
        assert await c.list(job="ray-job") == []


async def test_unknown_node_in_id_is_not_found(gateway):
    url, token, _, _ = gateway
    async with dsec.AsyncClient(url, token) as c:
        with pytest.raises(dsec.NotFound):
            await c.get("sb-ffffffff-000000000000")


async def test_wrong_token_is_refused_by_the_gateway(gateway):
    url, _, _, _ = gateway
    async with dsec.AsyncClient(url, "wrong") as c:
        with pytest.raises(dsec.Unauthorized):
            await c.list()


def _per_node(sbs) -> Counter:
    return Counter(s.info.node for s in sbs)


async def test_a_batch_is_split_over_all_three_nodes_in_one_call(gateway):
    url, token, nodes, _ = gateway
    async with dsec.AsyncClient(url, token) as c:
        sbs = await c.create_many(30, memory_mb=64, cpu=0.1, job="spread")
        try:
            counts = _per_node(sbs)
            assert len(sbs) == 30 and set(counts) == {n.node_id for n in nodes}, counts
            assert max(counts.values()) - min(counts.values()) <= 2, counts  # equal room
        finally:
            await asyncio.gather(*(s.stop() for s in sbs))


async def test_a_retried_create_or_batch_makes_nothing_twice(gateway):
    url, token, _, _ = gateway
    async with dsec.AsyncClient(url, token) as c:
        a = await c.create(memory_mb=64, job="retry", request_id="ep-7-create")
        b = await c.create(memory_mb=64, job="retry", request_id="ep-7-create")
        assert a.id == b.id
        first = await c.create_many(7, memory_mb=64, cpu=0.1, job="retry",
                                    request_id="ep-7-batch")
        again = await c.create_many(7, memory_mb=64, cpu=0.1, job="retry",
                                    request_id="ep-7-batch")
        try:
            assert sorted(s.id for s in first) == sorted(s.id for s in again)
            assert len(await c.list(job="retry")) == 8
            # a batch whose first attempt was cut short: only the missing items are made
            await first[0].stop()
            healed = await c.create_many(7, memory_mb=64, cpu=0.1, job="retry",
                                         request_id="ep-7-batch")
            assert len(healed) == 7 and len(await c.list(job="retry")) == 8
            assert {s.id for s in healed} - {s.id for s in first[1:]} not in (set(),)
        finally:
            for info in await c.list(job="retry"):
                await (await c.get(info.id)).stop()


async def test_two_gateways_placing_at_once_do_not_pile_onto_one_node(gateway):
    url, token, nodes, _ = gateway
    second = Gateway()
    try:
        async with dsec.AsyncClient(url, token) as c1, dsec.AsyncClient(second.url, token) as c2:
            made = await asyncio.gather(*(
                (c1 if i % 2 else c2).create(memory_mb=64, cpu=0.1, job="two-gw")
                for i in range(24)))
            try:
                counts = _per_node(made)
                assert set(counts) == {n.node_id for n in nodes}, counts
                assert max(counts.values()) <= 2 * (24 / 3), counts
            finally:
                await asyncio.gather(*(s.stop() for s in made))
    finally:
        second.stop()


def _wait_refused(url: str, within_s: float = 10.0) -> None:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex((host, int(port))) != 0:
                return
        time.sleep(0.02)
    raise AssertionError(f"{url} still accepts connections {within_s:g} s after the kill")


async def test_a_lost_node_fails_fast_gets_no_placements_and_comes_back(gateway):
    url, token, nodes, dirs = gateway
    async with dsec.AsyncClient(url, token, timeout=60) as c:
        sbs = await c.create_many(6, memory_mb=64, cpu=0.1, job="loss")
        victim = nodes[2]
        lost = [s for s in sbs if s.info.node == victim.node_id]
        kept = [s for s in sbs if s.info.node != victim.node_id]
        assert lost and kept
        await lost[0].exec("echo before > /tmp/mark")
        ray.kill(victim.actor)  # the agent dies; its sandboxes keep running
        _wait_refused(victim.url)  # ray.kill returns before the worker is gone
        try:
            deadline = time.monotonic() + 15
            took = None
            while True:  # ray.kill returns at once; the agent dies a moment later
                t0 = time.monotonic()
                try:
                    await lost[0].exec("true")
                except (dsec.NodeLost, dsec.Unavailable):
                    took = time.monotonic() - t0 if took is None else took
                health = (await c._request("GET", "/healthz")).json()
                if victim.node_id in health["unhealthy"] or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
            assert took is not None, "the killed node kept answering"
            assert victim.node_id in health["unhealthy"], health
            t0 = time.monotonic()
            with pytest.raises(dsec.NodeLost, match=victim.node_id):
                await c.get(lost[0].id)
            assert time.monotonic() - t0 < 0.5
            assert took < 3.0
            outs = await asyncio.gather(*(s.exec("echo ok") for s in kept))
            assert all(o.stdout == "ok\n" for o in outs)
            fresh = await c.create_many(6, memory_mb=64, cpu=0.1, job="loss")
            assert victim.node_id not in _per_node(fresh)
            listed = await c._request("GET", "/v1/sandboxes", params={"job": "loss"})
            assert victim.node_id in listed.json()["unreachable"]
            sbs += fresh
        finally:  # the agent comes back on the same state dir, with its sandboxes
            nodes[2] = start_node(dirs[2], "c")
        deadline = time.monotonic() + 15
        while True:
            try:
                r = await lost[0].exec("cat /tmp/mark")
                break
            except (dsec.NodeLost, dsec.Unavailable):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.3)
        assert r.stdout == "before\n"
        await asyncio.gather(*(s.stop() for s in sbs))


async def test_relayed_requests_survive_idle_gaps_around_the_keepalive_expiry(gateway):
    """The gateway's pooled connections to a node go idle across the window where the
    old gateway and node both expired them (5 s): every exec after each gap answers."""
    url, token, _, _ = gateway
    async with dsec.AsyncClient(url, token) as c:
        sbs = await c.create_many(9, memory_mb=64, cpu=0.1, job="keepalive")
        try:
            for gap in (4.9, 5.0, 5.1):
                await asyncio.sleep(gap)
                outs = await asyncio.gather(*(s.exec("echo up") for s in sbs))
                assert [o.stdout for o in outs] == ["up\n"] * len(sbs)
        finally:
            await asyncio.gather(*(s.stop() for s in sbs))


async def test_a_batch_bigger_than_the_cluster_makes_what_fits_in_one_answer(gateway):
    url, token, nodes, _ = gateway
    async with dsec.AsyncClient(url, token) as c:
        # each node may promise 8x its memory: a few 60 GiB sandboxes fit on each, not 40
        resp = await c._request("POST", "/v1/sandboxes/batch", json={
            "count": 40, "spec": {"memory_mb": 61440, "cpu": 0.1, "job": "too-big"}},
            timeout=None)
        body = resp.json()
        try:
            made, errors = body["sandboxes"], body["errors"]
            assert made and len(made) + len(errors) == 40, body
            assert all("capacity" in e for e in errors), errors[:3]
            assert {s["node"] for s in made} == {n.node_id for n in nodes}
        finally:
            for s in body["sandboxes"]:
                await (await c.get(s["id"])).stop()


async def test_gateway_metrics_name_nodes_and_routes(gateway):
    url, token, nodes, _ = gateway
    async with dsec.AsyncClient(url, token) as c:
        await c.list()
        text = (await c._request("GET", "/metrics")).text
    assert 'dsec_gateway_nodes{health="healthy"} 3.0' in text, text[:2000]
    assert 'route="/v1/sandboxes",status="200"' in text
    for n in nodes:
        assert f'dsec_gateway_node_sandboxes{{node="{n.node_id}"}}' in text
