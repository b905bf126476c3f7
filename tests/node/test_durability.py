"""SIGKILL the server while sandboxes run; after a restart they are all there and intact."""

import asyncio

import pytest

import dsec
from tests.support.server import ServerProcess, leftovers


@pytest.fixture
def own_server():
    srv = ServerProcess().start()
    yield srv
    srv.destroy()


async def test_sandboxes_survive_a_killed_server(own_server):
    srv = own_server
    async with dsec.AsyncClient(srv.url, srv.token) as c:
        sbs = await c.create_many(3, memory_mb=64, job="durable")
        await sbs[0].files.write("/tmp/state", b"precious")
        await sbs[1].exec("sleep 999", background=True)
        paused = sbs[2]
        await paused.pause()
    srv.kill()
    srv.proc = None
    srv.start()
    async with dsec.AsyncClient(srv.url, srv.token) as c:
        listed = {i.id: i for i in await c.list(job="durable")}
        assert set(listed) == {s.id for s in sbs}
        assert listed[paused.id].state == "paused"
        again = [await c.get(s.id) for s in sbs]
        assert await again[0].files.read("/tmp/state") == b"precious"
        assert "sleep 999" in (await again[1].exec("ps -o args")).stdout
        assert (await again[2].exec("echo thawed")).stdout == "thawed\n"
        await asyncio.gather(*(s.stop() for s in again))
    assert leftovers(srv.state_dir) == []


async def test_a_sandbox_killed_while_the_server_was_down_is_cleaned_up(own_server):
    import subprocess
    srv = own_server
    async with dsec.AsyncClient(srv.url, srv.token) as c:
        sb = await c.create(memory_mb=64)
    srv.kill()
    srv.proc = None
    subprocess.run(["runc", "--root", str(srv.state_dir / "runc"), "kill", sb.id, "KILL"],
                   check=True)
    await asyncio.sleep(0.5)
    srv.start()
    async with dsec.AsyncClient(srv.url, srv.token) as c:
        with pytest.raises(dsec.NotFound):
            await c.get(sb.id)
    assert leftovers(srv.state_dir) == []


def test_a_node_stopped_with_no_sandboxes_leaves_no_layer_mount(own_server):
    import httpx
    srv = own_server
    headers = {"authorization": f"Bearer {srv.token}"}
    r = httpx.post(f"{srv.url}/v1/sandboxes", json={"memory_mb": 64}, headers=headers)
    httpx.delete(f"{srv.url}/v1/sandboxes/{r.json()['id']}", headers=headers)
    srv.stop()
    mounts = open("/proc/self/mountinfo").read()
    assert str(srv.state_dir) not in mounts
