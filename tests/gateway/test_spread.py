"""Creates over a node whose connect fails while the watcher still counts it healthy (a
node that died between two probes, or one a request could not reach in time): the
request was never sent, so the sandbox is made on another node, and that one failure
does not mark the node lost. Two simulated node agents, each its own HTTP server on
loopback (real NodeService, SQLite store, trajectory log; the backend runs no process);
the first is killed, so its port refuses."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import dsec
from dsec.api.models import CreateManyRequest, SandboxSpec
from dsec.cluster.simulated import SimulatedNodes
from dsec.cluster.static import StaticCluster
from dsec.gateway.placer import Placer
from dsec.gateway.spread import create_batch, create_one
from dsec.gateway.watcher import Watcher
from dsec.placement.choose import rendezvous

TOKEN = "dsec_test_spread"
SPEC = SandboxSpec(cpu=0.05, memory_mb=64)


@pytest.fixture
async def gw(tmp_path):
    """A gateway's placement over two nodes, the first one killed after the last probe
    and made the emptiest, so placement picks it first (k=2 draws both nodes)."""
    nodes = SimulatedNodes(tmp_path, 2, TOKEN)
    await nodes.start()
    cluster = StaticCluster(nodes.urls, TOKEN)
    await cluster.discover()
    watcher = Watcher(cluster, period_s=3600.0, stale_after_s=3600.0)
    await watcher.refresh()  # both answered; no further probe (no loop started)
    dead, alive = (n.node.node_id for n in nodes.nodes)
    assert watcher.healthy(dead) and watcher.healthy(alive)
    watcher.pending.add(alive, 5, watcher.clock())
    await nodes.kill(0)
    yield SimpleNamespace(placer=Placer(cluster, watcher, k=2), watcher=watcher,
                          cluster=cluster, nodes=nodes, dead=dead, alive=alive)
    for c in cluster.clients():
        await c.close()
    await nodes.close()


async def test_a_create_whose_connect_failed_is_made_on_another_node(gw):
    info = await create_one(gw, SPEC)
    assert info.node == gw.alive
    assert gw.watcher.healthy(gw.dead)  # one failed connect is no verdict; the probe is
    assert gw.dead in gw.watcher._suspects  # ...and it is asked for now


async def test_with_an_idempotency_key_the_create_is_not_moved(gw):
    # a retry with the key asks the key's node: a sandbox elsewhere would be made twice
    loads = gw.watcher.loads()
    key = next(f"ep1-w{i}" for i in range(200) if rendezvous(loads, f"ep1-w{i}").node_id
               == gw.dead)  # a key that hashes to the dead node
    spec = SandboxSpec(cpu=0.05, memory_mb=64, request_id=key)
    with pytest.raises(dsec.NodeLost, match=gw.dead):
        await create_one(gw, spec)
    assert gw.nodes.sandboxes()[gw.alive] == 0


async def test_a_batch_share_whose_connect_failed_goes_to_the_other_node(gw):
    made, errors = await create_batch(gw, CreateManyRequest(count=6, spec=SPEC))
    assert errors == []
    assert len(made) == 6 and {s.node for s in made} == {gw.alive}
