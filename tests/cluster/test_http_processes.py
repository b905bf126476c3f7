"""Background processes and a sandbox's timeout through the HTTP node client (what a
gateway over remote node agents uses), against the session's real server: a node's own
API is the same app, so these are the routes and client a Ray gateway relays through."""

from __future__ import annotations

import time

import pytest

from dsec.api.errors import Conflict, NotFound
from dsec.api.models import SandboxSpec
from dsec.api.process import ProcessRequest, PtySize, StdinRequest
from dsec.cluster.http import HttpNodeClient


@pytest.fixture
async def node(sync_client, server):
    node_id = sync_client.nodes()[0].id
    client = HttpNodeClient(node_id, server.url, server.token)
    yield client
    await client.close()


async def test_processes_and_timeout_over_http(node):
    info = await node.create(SandboxSpec(memory_mb=64))
    try:
        later = await node.set_timeout(info.id, 5000)
        assert later.expires_at > time.time() + 4000
        p = await node.process_start(info.id, ProcessRequest(cmd="read x; echo got:$x",
                                                             stdin_open=True))
        assert [q.pid for q in await node.process_list(info.id)] == [p.pid]
        await node.process_stdin(info.id, p.pid, StdinRequest(data="aGkK", close=True))
        done = await node.process_wait(info.id, p.pid, None)
        assert not done.running and done.stdout == "got:hi\n"
        events = [ev async for ev in node.process_events(info.id, p.pid, 0)]
        assert [e.type for e in events] == ["stdout", "exit"]
        with pytest.raises(NotFound):
            await node.process_get(info.id, 4242424)
        sleeper = await node.process_start(info.id, ProcessRequest(cmd="sleep 300"))
        await node.process_signal(info.id, sleeper.pid, 9)
        assert (await node.process_wait(info.id, sleeper.pid, 30)).result is not None
    finally:
        await node.stop(info.id)


async def test_a_pty_process_resizes_over_http(node):
    info = await node.create(SandboxSpec(memory_mb=64))
    try:
        p = await node.process_start(info.id, ProcessRequest(
            cmd="read x; stty size", pty=PtySize(rows=24, cols=80)))
        assert p.pty
        await node.process_resize(info.id, p.pid, PtySize(rows=33, cols=77))
        await node.process_stdin(info.id, p.pid, StdinRequest(data="Cg=="))  # "\n"
        done = await node.process_wait(info.id, p.pid, None)
        assert "33 77" in done.stdout
        plain = await node.process_start(info.id, ProcessRequest(cmd="sleep 300"))
        with pytest.raises(Conflict):
            await node.process_resize(info.id, plain.pid, PtySize(rows=1, cols=1))
        with pytest.raises(Conflict):
            await node.process_stdin(info.id, plain.pid, StdinRequest(data="aGkK"))
        await node.process_signal(info.id, plain.pid, 9)
    finally:
        await node.stop(info.id)
