"""A node that answers the gateway's load probe with a refusal of its credential or with
garbage is marked unhealthy (no placements), through the real HTTP node client against a
real loopback server that answers each probe with fixed bytes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsec.api.errors import NodeLost
from dsec.api.models import ExecRequest, SandboxInfo, SandboxSpec
from dsec.cluster.http import HttpNodeClient, counts_from_header, load_to_wire
from dsec.cluster.static import StaticCluster
from dsec.gateway.watcher import Watcher
from dsec.placement.admission import NodeLoad

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


def _answer(status: int, body: bytes) -> bytes:
    return (b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
            % (status, len(body)) + body)


@pytest.fixture
async def liar():
    """A node that answers its load probe as node-liar should, and every other request
    with what no dsec node sends (by path): the gateway must not believe it."""
    load = json.dumps([load_to_wire(NodeLoad("node-liar", ("container",), 8, 16384, 0, 0,
                                             0.0))]).encode()
    other = SandboxInfo(id="sb-other-1", node="node-other", backend="container",
                        image="busybox", state="running", created_at=0.0, cpu=0.5,
                        memory_mb=64, disk_mb=64, last_active_at=0.0).model_dump_json().encode()
    by_path = {
        "/v1/nodes/load": _answer(200, load),
        "/v1/sandboxes": _answer(201, other),  # another node's sandbox, as its own
        "/v1/sandboxes/batch": _answer(200, b'{"sandboxes": [], "errors": [1, 2]}'),
        "/v1/sandboxes/sb-liar-1": _answer(200, b'{"id": 5}'),
        "/v1/sandboxes/sb-liar-1/exec": _answer(200, b"[[[["),
        "/v1/jobs": _answer(200, b"<html>proxy</html>"),
        "/v1/nodes": _answer(200, b"[]"),  # a node list without itself
        "/v1/sandboxes/sb-liar-1/pause": _answer(401, b'{"detail": "who are you"}'),
        "/v1/sandboxes/sb-liar-1/resume": _answer(502, b"<html>bad gateway</html>"),
    }

    async with _serving(by_path) as url:
        yield url


@contextlib.asynccontextmanager
async def _serving(by_path: dict[str, bytes]):
    """A loopback server answering each request with the bytes its path maps to."""
    async def handle(reader, writer):
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            path = head.split(b" ", 2)[1].split(b"?")[0].decode()
            length = re.search(rb"content-length: (\d+)", head, re.I)
            if length:
                await reader.readexactly(int(length.group(1)))
            writer.write(by_path.get(path, _answer(404, b"{}")))
            await writer.drain()
        finally:
            writer.close()
    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
    finally:
        srv.close()
        await srv.wait_closed()


VERBS = {
    "create": lambda c: c.create(SandboxSpec(memory_mb=64)),
    "create_many": lambda c: c.create_many(2, SandboxSpec(memory_mb=64)),
    "get": lambda c: c.get("sb-liar-1"),
    "exec": lambda c: c.exec("sb-liar-1", ExecRequest(cmd="true")),
    "jobs": lambda c: c.jobs(),
    "node_info": lambda c: c.node_info(),
    "pause (a 401: it refuses the gateway's credential)": lambda c: c.pause("sb-liar-1"),
    "resume (a proxy's page)": lambda c: c.resume("sb-liar-1"),
}


@pytest.mark.parametrize("verb", sorted(VERBS))
async def test_a_node_that_answers_its_probes_but_lies_otherwise_is_not_believed(liar, verb):
    """Each verb's garbage is NodeLost naming the node (a 503 at the gateway, not a 500
    nor another node's sandbox handed on), and the node is then distrusted: no placements
    although its probes still answer well."""
    client = HttpNodeClient("node-liar", liar, "cluster-credential")
    w = Watcher(Cluster(client), timeout_s=2.0)
    try:
        await w.refresh()
        assert w.healthy("node-liar")
        with pytest.raises(NodeLost, match="node-liar.*answered what no dsec node sends"):
            await VERBS[verb](client)
        await w.refresh()  # a good probe does not make it trusted again
        assert not w.healthy("node-liar") and w.loads() == []
        assert "answered what no dsec node sends" in w.view("node-liar").error
    finally:
        await client.close()


async def test_bad_node_urls_are_left_out_with_why_and_the_good_ones_served(
        node_answering, liar, caplog):
    """Discovery over a fixed list: a URL naming itself with no node id, one claiming a
    node id another URL has, one refusing the cluster credential and one that is not
    HTTP do not stop the gateway (they did: AttributeError, ValueError at start-up); each
    is logged with why, and the good URL is served."""
    bad = {
        "not a node id": await node_answering(_answer(200, b'[{"node_id": 12345}]')),
        "impersonates": await node_answering(_answer(200, json.dumps(
            [{"node_id": "node-liar"}]).encode())),
        "refuses the credential": await node_answering(ANSWERS["wrong token"]),
        "not http": await node_answering(ANSWERS["not http"]),
    }
    cluster = StaticCluster([liar, *bad.values()], "cluster-credential")
    with caplog.at_level(logging.WARNING, logger="dsec.cluster.static"):
        await cluster.start()
    try:
        assert [c.node_id for c in cluster.clients()] == ["node-liar"]
        logged = caplog.text
        assert "12345" in logged and "not a node id" in logged
        assert f"it says it is node-liar, which {liar} is" in logged
        assert "refuses this gateway's cluster credential" in logged
        assert all(url in logged for url in bad.values())
    finally:
        await cluster.close()


async def test_a_request_this_side_cannot_build_does_not_get_the_node_distrusted(liar):
    """Odd input a caller sent (here a path httpx refuses) fails before anything reaches
    the node: that is no answer of the node's, so the node stays trusted."""
    client = HttpNodeClient("node-liar", liar, "cluster-credential")
    w = Watcher(Cluster(client), timeout_s=2.0)
    try:
        await w.refresh()
        with pytest.raises(Exception) as caught:
            await client.get("sb-liar-\ud800")
        assert not isinstance(caught.value, NodeLost)
        assert w.healthy("node-liar")
    finally:
        await client.close()


@pytest.mark.parametrize("value,counts", [
    (b"12 768 1.500", (12, 768, 1.5)),
    (b"  3   64 0.05 ", (3, 64, 0.05)),
    (b"12 768", None), (b"12 768 1.5 9", None), (b"-1 0 0", None), (b"1 1 nan", None),
    (b"1 1 inf", None), (b"99999999999999999999 0 0", None), (b"1.5 0 0", None),
    (b"\xff\xfe 1 1", None), (b"", None)])
def test_a_create_answers_counts_are_read_only_when_they_make_sense(value, counts):
    assert counts_from_header(value) == counts


@given(st.binary(max_size=64) | st.text(max_size=64))
def test_no_counts_header_a_node_can_send_raises(value):
    got = counts_from_header(value)
    assert got is None or (len(got) == 3 and min(got) >= 0)


@pytest.mark.parametrize("header,taken", [(b"5 320 2.500", True), (b"lots of them", False),
                                          (b"-5 0 0", False), (None, False)])
async def test_a_create_answers_counts_steer_placement_only_when_they_make_sense(
        header, taken):
    """A node's own sandbox with its counts: the watcher takes them; with counts that do
    not parse (or none), the create still stands and the view keeps its probe's figures."""
    own = SandboxInfo(id="sb-one-1", node="node-one", backend="container", image="busybox",
                      state="running", created_at=0.0, cpu=0.5, memory_mb=64, disk_mb=64,
                      last_active_at=0.0).model_dump_json().encode()
    load = json.dumps([load_to_wire(NodeLoad("node-one", ("container",), 8, 16384, 0, 0,
                                             0.0))]).encode()
    extra = b"" if header is None else b"x-dsec-node-load: " + header + b"\r\n"
    created = (b"HTTP/1.1 201 Created\r\ncontent-type: application/json\r\n%s"
               b"content-length: %d\r\n\r\n%s" % (extra, len(own), own))
    async with _serving({"/v1/nodes/load": _answer(200, load), "/v1/sandboxes": created}) as url:
        client = HttpNodeClient("node-one", url, "cluster-credential")
        w = Watcher(Cluster(client), timeout_s=2.0)
        try:
            await w.refresh()
            info = await client.create(SandboxSpec(memory_mb=64))
            assert info.id == "sb-one-1" and w.healthy("node-one")
            now = w.view("node-one").load
            assert (now.sandboxes, now.memory_reserved_mb, now.cpu_reserved) == (
                (5, 320, 2.5) if taken else (0, 0, 0.0))
        finally:
            await client.close()
