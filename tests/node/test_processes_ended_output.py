"""The node keeps the output of ended background processes within a budget per sandbox
(every E2B command is one): past it the oldest ended records go (fake backend)."""

import pytest

import dsec
from dsec.api.models import SandboxSpec
from dsec.api.process import ProcessRequest
from dsec.node import processes
from tests.support.fakenode import fake_node


@pytest.fixture
async def node(tmp_path):
    svc = fake_node(tmp_path, "node-fa4e0003")
    yield svc
    await svc.close(stop_sandboxes=True)


async def test_the_oldest_ended_output_goes_past_the_budget(node, monkeypatch):
    monkeypatch.setattr(processes, "KEEP_ENDED_BYTES", 2500)
    sb = await node.create(SandboxSpec())
    pids = []
    for _ in range(3):
        p = await node.process_start(sb.id, ProcessRequest(
            cmd="head -c 1000 /dev/zero | tr '\\0' x"))
        await node.processes.wait(sb.id, p.pid, None)
        pids.append(p.pid)
    running = await node.process_start(sb.id, ProcessRequest(cmd="sleep 60"))
    listed = {i.pid for i in node.processes.list(sb.id)}
    assert listed == {pids[1], pids[2], running.pid}  # 3000 ended bytes: the first went
    assert len(node.processes.get(sb.id, pids[2]).stdout) == 1000
    with pytest.raises(dsec.NotFound):
        node.processes.get(sb.id, pids[0])
