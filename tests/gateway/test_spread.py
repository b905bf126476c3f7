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
async def both(tmp_path):
    """A gateway's placement over two nodes that both answer (until a test kills one)."""
    nodes = SimulatedNodes(tmp_path, 2, TOKEN)
    await nodes.start()
    cluster = StaticCluster(nodes.urls, TOKEN)
    await cluster.discover()
    watcher = Watcher(cluster, period_s=3600.0, stale_after_s=3600.0)
    await watcher.refresh()
    first, second = (n.node.node_id for n in nodes.nodes)
    yield SimpleNamespace(placer=Placer(cluster, watcher, k=2), watcher=watcher,
                          cluster=cluster, nodes=nodes, dead=first, alive=second)
    for c in cluster.clients():
        await c.close()
    await nodes.close()


@pytest.fixture
async def gw(both):
    """The same, the first node killed after the last probe and made the emptiest, so
    placement picks it first (k=2 draws both nodes)."""
    assert both.watcher.healthy(both.dead) and both.watcher.healthy(both.alive)
    both.watcher.pending.add(both.alive, 5, both.watcher.clock())
    await both.nodes.kill(0)
    yield both


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


async def _mark_dead(gw) -> None:
    """The watcher hears the dead node refuse its probes: marked, no placements."""
    for _ in range(gw.watcher.max_failures):
        await gw.watcher.refresh()
    assert not gw.watcher.healthy(gw.dead) and gw.watcher.healthy(gw.alive)


async def test_a_keyed_create_whose_node_is_marked_lost_is_not_made_elsewhere(gw):
    """Once the key's node is marked, it is no longer among the healthy nodes: hashing
    the key over those alone sent the retry to the other node, a second sandbox."""
    key = next(f"ep2-w{i}" for i in range(200) if rendezvous(
        gw.watcher.loads(), f"ep2-w{i}").node_id == gw.dead)
    other = next(f"ep2-w{i}" for i in range(200) if rendezvous(
        gw.watcher.loads(), f"ep2-w{i}").node_id == gw.alive)
    await _mark_dead(gw)
    with pytest.raises(dsec.NodeLost, match=f"{key}.*{gw.dead}.*retry when the node is back"):
        await create_one(gw, SandboxSpec(cpu=0.05, memory_mb=64, request_id=key))
    assert gw.nodes.sandboxes()[gw.alive] == 0
    made = await create_one(gw, SandboxSpec(cpu=0.05, memory_mb=64, request_id=other))
    assert made.node == gw.alive  # keys of the nodes that answer are served as ever


async def test_a_keyed_batch_retried_while_a_node_is_lost_is_not_made_again(both):
    first, errors = await create_batch(both, CreateManyRequest(count=6, spec=SPEC,
                                                               request_id="job-7"))
    assert errors == [] and {s.node for s in first} == {both.dead, both.alive}
    await both.nodes.kill(0)
    await _mark_dead(both)
    before = both.nodes.sandboxes()[both.alive]
    with pytest.raises(dsec.NodeLost, match="job-7.*did not, and may hold the rest"):
        await create_batch(both, CreateManyRequest(count=6, spec=SPEC, request_id="job-7"))
    assert both.nodes.sandboxes()[both.alive] == before  # nothing made a second time


async def test_a_keyed_batch_returns_the_items_asked_for_not_an_earlier_attempts_others(
        both):
    await create_batch(both, CreateManyRequest(count=6, spec=SPEC, request_id="job-8"))
    again, errors = await create_batch(both, CreateManyRequest(count=4, spec=SPEC,
                                                               request_id="job-8"))
    assert errors == [] and len(again) == 4
    assert [s.request_id for s in again] == [f"job-8#{i}" for i in range(4)]
