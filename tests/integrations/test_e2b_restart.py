"""Background commands outlive a node restart (SIGKILL of the server, then a new one on the
same state): the e2b SDK's commands.connect(pid) and dsec's sb.process(pid) follow them
again, and their stdin still reaches them."""

from __future__ import annotations

import asyncio

import pytest
from e2b import Sandbox

import dsec
from tests.support.server import ServerProcess, leftovers


@pytest.fixture(scope="module")
def own_server():
    srv = ServerProcess().start()
    yield srv
    srv.stop_all_sandboxes()
    left = leftovers(srv.state_dir)
    srv.destroy()
    assert not left, f"the restart tests left things behind: {left}"


def _restart(srv: ServerProcess) -> None:
    srv.kill()
    srv.proc = None
    srv.start()


def _first_stdout(handle) -> str:
    for stdout, _, _ in handle:
        if stdout:
            return stdout
    raise AssertionError("the command ended before it wrote anything")


def test_an_e2b_command_is_connected_to_again_after_a_restart(own_server, monkeypatch):
    monkeypatch.setenv("E2B_API_URL", f"{own_server.url}/e2b")
    monkeypatch.setenv("E2B_SANDBOX_URL", f"{own_server.url}/e2b/envd")
    monkeypatch.setenv("E2B_API_KEY", own_server.token)
    sb = Sandbox.create(template="busybox", timeout=300)
    h = sb.commands.run("echo before; read x; echo after:$x", background=True, stdin=True)
    assert _first_stdout(h) == "before\n"  # the old node had it: it went with the node
    _restart(own_server)
    assert h.pid in [p.pid for p in sb.commands.list()]
    again = sb.commands.connect(h.pid)
    sb.commands.send_stdin(h.pid, "y\n")
    r = again.wait()
    assert (r.exit_code, r.stdout) == (0, "after:y\n")
    sb.kill()


def test_a_dsec_process_is_followed_again_with_what_it_wrote_meanwhile(own_server):
    async def before() -> tuple[str, int]:
        async with dsec.AsyncClient(own_server.url, own_server.token) as c:
            sb = await c.create(image="busybox", memory_mb=64)
            # "during" comes while the node is down (held by the in-sandbox agent) or just
            # after it is back: either way it is there, and nothing before it is lost
            p = await sb.spawn("sleep 0.5; echo during; read x; echo got:$x; echo err >&2; "
                               "exit 5", stdin_open=True)
            return sb.id, p.pid

    async def after(sb_id: str, pid: int) -> None:
        async with dsec.AsyncClient(own_server.url, own_server.token) as c:
            sb = await c.get(sb_id)
            p = await sb.process(pid)
            await p.send_stdin("z\n")
            r = await p.wait()
            assert (r.exit_code, r.stdout, r.stderr) == (
                5, "during\ngot:z\n", "err\n")
            await sb.stop()

    sb_id, pid = asyncio.run(before())
    _restart(own_server)
    asyncio.run(after(sb_id, pid))
