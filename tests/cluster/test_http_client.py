"""HttpNodeClient against a node that hangs: a real TCP server on loopback that takes the
request and never answers (or answers the first request on each connection, then hangs).
What is in flight ends with NodeLost when the client is told the node is lost, instead of
waiting as long as the node hangs."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

import dsec
from dsec.api.models import ExecRequest
from dsec.cluster.http import HttpNodeClient

SB = "sb-0123abcd-000000000000"
NO_PROCESSES = b'{"processes":[]}'


@contextlib.asynccontextmanager
async def _serve(answer_first: bool):
    conns = []

    async def swallow(reader, writer):
        conns.append(writer)
        if answer_first:  # one answer on a connection kept alive, then the node hangs
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n%s" % (len(NO_PROCESSES), NO_PROCESSES))
        await reader.read(1 << 16)  # take the request, answer nothing, keep it open

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        for w in conns:
            w.close()
        server.close()
        await server.wait_closed()


@pytest.fixture
async def hung_node():
    async with _serve(answer_first=False) as url:
        yield url


@pytest.fixture
async def hangs_after_one():
    async with _serve(answer_first=True) as url:
        yield url


async def _all_lost(tasks, node_id: str) -> None:
    for t in tasks:
        with pytest.raises(dsec.NodeLost, match=node_id):
            await asyncio.wait_for(t, 2.0)


async def test_requests_in_flight_to_a_lost_node_end_at_once(hung_node):
    client = HttpNodeClient("node-0123abcd", hung_node, "token")
    try:
        execs = [asyncio.create_task(client.exec(SB, ExecRequest(cmd=["true"])))
                 for _ in range(3)]
        get = asyncio.create_task(client.get(SB))
        await asyncio.sleep(0.3)
        assert not any(t.done() for t in [*execs, get])  # the node hangs: so do they
        client.abort()
        await _all_lost([*execs, get], "node-0123abcd")  # a GET is not retried either
    finally:
        await client.close()


async def test_an_idempotent_request_on_a_kept_alive_connection_is_not_retried(
        hangs_after_one):
    """A connection that answered before looks stale when it closes unanswered, and a
    GET on a stale one is retried on a new connection: to the same hung node, where it
    waited for ever (what a SIGSTOPped node agent did to the watcher's abort)."""
    client = HttpNodeClient("node-0123abcd", hangs_after_one, "token")
    try:
        await asyncio.gather(*(client.process_list(SB) for _ in range(3)))  # kept alive
        gets = [asyncio.create_task(client.process_list(SB)) for _ in range(3)]
        await asyncio.sleep(0.3)
        assert not any(t.done() for t in gets)
        client.abort()
        await _all_lost(gets, "node-0123abcd")
    finally:
        await client.close()


async def test_a_request_still_waiting_for_a_connection_ends_unsent(hung_node):
    client = HttpNodeClient("node-0123abcd", hung_node, "token", max_connections=1)
    try:
        first = asyncio.create_task(client.exec(SB, ExecRequest(cmd=["true"])))
        queued = asyncio.create_task(client.exec(SB, ExecRequest(cmd=["true"])))
        await asyncio.sleep(0.3)
        assert not first.done() and not queued.done()
        client.abort()
        await _all_lost([first], "node-0123abcd")
        with pytest.raises(dsec.NodeLost) as lost:
            await asyncio.wait_for(queued, 2.0)
        assert lost.value.sent is False  # never sent: a create may go to another node
    finally:
        await client.close()
