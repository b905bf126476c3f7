"""A call under way when its token is revoked ends on a remote node too: the gateway
answers Unauthorized and drops its request to the node, whose own API then ends the
command instead of running it to its timeout.

Real parts: a node agent with the container backend serving its own API on loopback (as
a Ray node actor does, without Ray) and a gateway with projects over it, in this process.
"""

from __future__ import annotations

import asyncio

import pytest

import dsec
from dsec.cluster.ray import _NodeActor
from dsec.cluster.static import StaticCluster
from dsec.gateway.app import create_app
from dsec.gateway.projects import Projects
from tests.support.gateway import serving
from tests.support.server import leftovers

CLUSTER = "dsec_test_revoke_cluster"  # gateway -> node
ROOT = "dsec_test_revoke_root"        # user -> gateway


@pytest.fixture
async def remote(tmp_path):
    """The gateway's URL over a remote node, with a project ``p``."""
    state = tmp_path / "node"
    node = _NodeActor(str(state), CLUSTER, ["container"], host="127.0.0.1")
    _, node_url = await node.start()
    try:
        app = create_app(StaticCluster([node_url], CLUSTER), ROOT,
                         projects=Projects(ROOT, tmp_path / "projects.db"))
        async with serving(app) as url:
            async with dsec.AsyncClient(url, ROOT) as root:
                await root.projects.create("p")
                yield url, root
    finally:
        await node.shutdown()
    assert not leftovers(state)


@pytest.mark.parametrize("how", ["exec", "shell"])
async def test_a_revoked_tokens_command_ends_on_a_remote_node(remote, how):
    url, root = remote
    made = await root.projects.create_token_info("p", ttl_s=600)
    async with dsec.AsyncClient(url, made.token) as c:
        sb = await c.create(memory_mb=64)
        try:
            call = sb.exec("sleep 611", timeout=700) if how == "exec" else \
                (await sb.shell()).run("sleep 611", timeout=700)
            task = asyncio.ensure_future(call)
            await asyncio.sleep(1.0)
            await root.projects.revoke_token(made.id)
            with pytest.raises(dsec.Unauthorized, match="revoked"):
                await asyncio.wait_for(task, 15)
            as_root = await root.get(sb.id)
            for _ in range(50):  # the node hears the gateway leave at once; allow 5 s
                ps = await as_root.exec("ps -o pid,args | grep 'sleep 611' | grep -v grep")
                if ps.stdout == "":
                    break
                await asyncio.sleep(0.1)
            assert ps.stdout == ""
        finally:
            await (await root.get(sb.id)).stop()
