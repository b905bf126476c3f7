"""A node agent that hangs (SIGSTOP: the kernel still accepts its connections, nothing
answers) has what is in flight to it ended with NodeLost once the watcher marks it
unhealthy, and its creates once the watcher has heard nothing from it for
``abort_after_s``, not left waiting as long as it hangs.

A real simulated node agent (NodeService, SQLite store, uvicorn on loopback; its backend
runs no process) in a process of its own, so it can be stopped; the gateway's side is the
real StaticCluster, HttpNodeClient and Watcher loop, with short periods."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys

import pytest

import dsec
from dsec.api.models import ExecRequest, SandboxSpec
from dsec.cluster.static import StaticCluster
from dsec.gateway.watcher import Watcher

TOKEN = "dsec_test_hung_node"
HANG_GUARD_S = 60.0  # only so that a failing run ends: the mark comes after ~0.5 s
ABORT_AFTER_S = 5.0


@pytest.fixture
async def node(tmp_path):
    (tmp_path / "token").write_text(TOKEN)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "dsec.cluster.simulated", "--nodes", "1",
        "--state-dir", str(tmp_path / "state"), "--token-file", str(tmp_path / "token"),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 120)
        assert line, "the simulated node agent ended before it answered"
        proc.url = json.loads(line)["urls"][0]
        yield proc
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGCONT)
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()


@pytest.fixture
async def gw(node):
    cluster = StaticCluster([node.url], TOKEN)
    await cluster.start()
    watcher = Watcher(cluster, period_s=0.1, stale_after_s=0.5, timeout_s=0.3,
                      abort_after_s=ABORT_AFTER_S)
    await watcher.start()
    client = cluster.clients()[0]
    try:
        yield watcher, client
    finally:
        await watcher.stop()
        await cluster.close()


async def test_requests_in_flight_to_a_hung_node_end_when_marked_its_creates_later(node, gw):
    watcher, client = gw
    sb = await client.create(SandboxSpec(cpu=0.05, memory_mb=64))
    for _ in range(3):  # connections kept alive: those in flight below reuse them
        await asyncio.gather(client.get(sb.id), client.exec(sb.id, ExecRequest(cmd="true")))
    os.killpg(node.pid, signal.SIGSTOP)
    reads = [asyncio.create_task(client.get(sb.id)),  # idempotent: once retried itself
             asyncio.create_task(client.exec(sb.id, ExecRequest(cmd="true"))),
             asyncio.create_task(client.process_list(sb.id)),
             asyncio.create_task(client.list())]
    create = asyncio.create_task(client.create(SandboxSpec(cpu=0.05, memory_mb=64)))
    done, _ = await asyncio.wait([*reads, create], timeout=0.2)
    assert not done or client.lost  # the node hangs: so do they, until the mark
    for task in reads:
        with pytest.raises(dsec.NodeLost, match=client.node_id):
            await asyncio.wait_for(task, HANG_GUARD_S)
    assert not watcher.healthy(client.node_id) and client.lost
    # the create is left to the node for abort_after_s (it may be busy making it)...
    assert not create.done() and not client.aborted
    with pytest.raises(dsec.NodeLost, match=client.node_id):  # ...then ended too
        await asyncio.wait_for(create, HANG_GUARD_S)
    assert client.aborted
    os.killpg(node.pid, signal.SIGCONT)  # back: revived by the next probe, serves again
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    while not watcher.healthy(client.node_id) and loop.time() - t0 < HANG_GUARD_S:
        await asyncio.sleep(0.05)
    assert watcher.healthy(client.node_id) and not client.lost and not client.aborted
    assert (await client.get(sb.id)).id == sb.id
    for made in await client.list():  # the create may have been made after all
        await client.stop(made.id)
