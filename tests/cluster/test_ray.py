"""A real two-node Ray cluster on this machine: two raylets, a node agent on each, and the
gateway placing and relaying over HTTP. (Both "machines" are this host: the only fake.)"""

import asyncio
import shutil
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
    ray.init(address=cluster.address, namespace="dsec", log_to_driver=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture(scope="module")
def gateway(ray_cluster):
    import uvicorn

    from dsec.cluster.ray import RayCluster, start_node_actor
    from dsec.gateway.proxy import create_proxy_app
    token = "dsec_test_cluster_token"
    dirs = [Path(tempfile.mkdtemp(prefix="dsec-ray-")) for _ in range(2)]
    nodes = [start_node_actor(d, token, resources={f"machine-{m}": 0.01})
             for d, m in zip(dirs, "ab")]
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_proxy_app(RayCluster(refresh_s=0.5), token),
                                           host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", token, nodes
    server.should_exit = True
    thread.join(10)
    for n in nodes:
        ray.get(n.actor.shutdown.remote())
        ray.kill(n.actor)
    for d in dirs:
        assert not [p for p in (d / "sandboxes").iterdir()], "sandbox dirs left behind"
        shutil.rmtree(d, ignore_errors=True)


async def test_two_nodes_are_found(gateway):
    url, token, nodes = gateway
    async with dsec.AsyncClient(url, token) as c:
        assert {n.id for n in await c.nodes()} == {n.node_id for n in nodes}


async def test_sandboxes_spread_and_requests_reach_their_node(gateway):
    url, token, nodes = gateway
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
    url, token, _ = gateway
    async with dsec.AsyncClient(url, token) as c:
        with pytest.raises(dsec.NotFound):
            await c.get("sb-ffffffff-000000000000")


async def test_wrong_token_is_refused_by_the_gateway(gateway):
    url, _, _ = gateway
    async with dsec.AsyncClient(url, "wrong") as c:
        with pytest.raises(dsec.Unauthorized):
            await c.list()
