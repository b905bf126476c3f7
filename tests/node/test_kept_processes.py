"""Background processes outlive the node agent: a node that stops (or dies) leaves them
running in their sandboxes, and the next node on the same state follows them again by pid
(the fake backend: the real in-sandbox agent on a unix socket, no runc)."""

import base64

from dsec.api.models import SandboxSpec
from dsec.api.process import ProcessRequest
from dsec.node.agent.build import ensure_agent
from dsec.node.backends.fake import FakeBackend
from dsec.node.config import NodeConfig
from dsec.node.service import NodeService


async def _node(tmp_path) -> NodeService:
    config = NodeConfig(state_dir=tmp_path, backends=["container"])
    backend = FakeBackend(tmp_path, ensure_agent(tmp_path / "bin"))
    return await NodeService.open(config, {"container": backend})


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


async def test_a_process_is_followed_again_by_the_next_node(tmp_path):
    node = await _node(tmp_path)
    sb = await node.create(SandboxSpec())
    p = await node.process_start(sb.id, ProcessRequest(
        cmd="read x; echo got:$x; echo err >&2; exit 4", stdin_open=True))
    await node.close()
    node = await _node(tmp_path)
    try:
        await node.processes.ready(sb.id)
        (listed,) = node.processes.list(sb.id)
        assert (listed.pid, listed.cmd, listed.running) == (p.pid, p.cmd, True)
        await node.processes.stdin(sb.id, p.pid, _b64("z\n"), False)
        info = await node.processes.wait(sb.id, p.pid, None)
        assert (info.result.exit_code, info.stdout, info.stderr) == (4, "got:z\n", "err\n")
    finally:
        await node.close(stop_sandboxes=True)


async def test_what_a_process_wrote_with_no_node_comes_first(tmp_path):
    node = await _node(tmp_path)
    sb = await node.create(SandboxSpec())
    p = await node.process_start(sb.id, ProcessRequest(cmd="read x; echo got:$x; exit 2",
                                                       stdin_open=True))
    await node.close()
    # nobody follows it now; its stdin is a pipe the test can reach (the fake backend has
    # no pid namespace): it reads, prints and ends, and its agent holds both for the next node
    with open(f"/proc/{p.pid}/fd/0", "w") as stdin:
        stdin.write("in\n")
    node = await _node(tmp_path)
    try:
        await node.processes.ready(sb.id)
        info = await node.processes.wait(sb.id, p.pid, None)
        assert (info.result.exit_code, info.stdout) == (2, "got:in\n")
    finally:
        await node.close(stop_sandboxes=True)
