"""HttpNodeClient against a node that hangs: a real TCP server on loopback that takes the
request and never answers. What is in flight ends with NodeLost when the client is told
the node is lost, instead of waiting as long as the node hangs."""

from __future__ import annotations

import asyncio

import pytest

import dsec
from dsec.api.models import ExecRequest
from dsec.cluster.http import HttpNodeClient


@pytest.fixture
async def hung_node():
    conns = []

    async def swallow(reader, writer):
        conns.append(writer)
        await reader.read(1 << 16)  # take the request, answer nothing, keep it open

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    for w in conns:
        w.close()
    server.close()
    await server.wait_closed()


async def test_requests_in_flight_to_a_lost_node_end_at_once(hung_node):
    client = HttpNodeClient("node-0123abcd", hung_node, "token")
    try:
        execs = [asyncio.create_task(client.exec("sb-0123abcd-000000000000",
                                                 ExecRequest(cmd=["true"])))
                 for _ in range(3)]
        get = asyncio.create_task(client.get("sb-0123abcd-000000000000"))
        await asyncio.sleep(0.3)
        assert not any(t.done() for t in [*execs, get])  # the node hangs: so do they
        client.abort()
        for t in [*execs, get]:  # a GET is not retried on a node given up on
            with pytest.raises(dsec.NodeLost, match="node-0123abcd"):
                await asyncio.wait_for(t, 2.0)
    finally:
        await client.close()
