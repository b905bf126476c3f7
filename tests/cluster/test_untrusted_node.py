"""A node that answers the gateway's load probe with a refusal of its credential or with
garbage is marked unhealthy (no placements), through the real HTTP node client against a
real loopback server that answers each probe with fixed bytes."""

from __future__ import annotations

import asyncio

import pytest

from dsec.cluster.http import HttpNodeClient
from dsec.gateway.watcher import Watcher

OK_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"

ANSWERS = {
    "wrong token": b"HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\n"
                   b"content-length: 66\r\n\r\n"
                   b'{"error":{"code":"unauthorized","message":"wrong bearer token"}}  ',
    "not json": OK_HEAD + b"content-length: 9\r\n\r\nnot json!",
    "wrong shape": OK_HEAD + b"content-length: 19\r\n\r\n[{\"node_id\": 12.5}]",
    "not http": b"SSH-2.0-OpenSSH_9.2\r\n\r\n",
}


class Cluster:
    def __init__(self, client) -> None:
        self.client = client

    def clients(self):
        return [self.client]


@pytest.fixture
async def node_answering():
    servers = []

    async def start(answer: bytes) -> str:
        async def handle(reader, writer):
            try:
                await reader.readuntil(b"\r\n\r\n")
                writer.write(answer)
                await writer.drain()
            finally:
                writer.close()
        srv = await asyncio.start_server(handle, "127.0.0.1", 0)
        servers.append(srv)
        return f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"

    yield start
    for srv in servers:
        srv.close()
        await srv.wait_closed()


@pytest.mark.parametrize("case", sorted(ANSWERS))
async def test_a_node_answering_a_refusal_or_garbage_is_not_trusted(node_answering, case):
    url = await node_answering(ANSWERS[case])
    client = HttpNodeClient("node-bad", url, "cluster-credential")
    w = Watcher(Cluster(client), timeout_s=2.0)
    try:
        for _ in range(w.max_failures):
            await w.refresh()
        assert not w.healthy("node-bad")
        assert w.loads() == []
        assert w.view("node-bad").error  # says why, for /healthz and the log
    finally:
        await client.close()
