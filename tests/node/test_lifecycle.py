"""Create, list, filter, pause, expire and stop; stop leaves nothing behind."""

import asyncio
import time

import pytest

import dsec
from dsec.node.host.cgroups import detect


async def test_list_filters_by_job_and_label(client):
    a = await client.create(memory_mb=64, job="job-a", labels={"team": "x"})
    b = await client.create(memory_mb=64, job="job-b", labels={"team": "y"})
    try:
        assert [i.id for i in await client.list(job="job-a")] == [a.id]
        assert [i.id for i in await client.list(labels={"team": "y"})] == [b.id]
        assert {a.id, b.id} <= {i.id for i in await client.list()}
    finally:
        await asyncio.gather(a.stop(), b.stop())


async def test_create_many_starts_them_all(client):
    many = await client.create_many(6, memory_mb=64, job="batch")
    try:
        assert len({s.id for s in many}) == 6
        outs = await asyncio.gather(*(s.exec("hostname") for s in many))
        assert [o.stdout.strip() for o in outs] == [s.id for s in many]
    finally:
        await asyncio.gather(*(s.stop() for s in many))


async def test_stop_removes_every_trace(client, server):
    sb = await client.create(memory_mb=64)
    await sb.exec("sleep 1000", background=True)
    d = server.state_dir / "sandboxes" / sb.id
    assert d.exists()
    await sb.stop()
    assert not d.exists()
    assert not (server.state_dir / "runc" / sb.id).exists()
    assert detect().leftovers(f"/dsec/{sb.id}") == []
    assert sb.id not in open("/proc/self/mountinfo").read()
    with pytest.raises(dsec.NotFound):
        await client.get(sb.id)


async def test_pause_freezes_and_exec_resumes(client):
    sb = await client.create(memory_mb=64)
    try:
        await sb.files.write("/tmp/keep", b"1")
        info = await sb.pause()
        assert info.state == "paused"
        r = await sb.exec("cat /tmp/keep")
        assert r.stdout == "1"
        assert (await sb.refresh()).state == "running"
    finally:
        await sb.stop()


async def test_ttl_expires(client):
    sb = await client.create(memory_mb=64, ttl_s=1)
    deadline = time.time() + 15
    while time.time() < deadline:
        if sb.id not in {i.id for i in await client.list()}:
            break
        await asyncio.sleep(0.5)
    else:
        await sb.stop()
        pytest.fail("sandbox outlived its ttl_s")


async def test_idle_ttl_stops_an_unused_sandbox_but_not_a_used_one(client):
    idle = await client.create(memory_mb=64, idle_ttl_s=2)
    busy = await client.create(memory_mb=64, idle_ttl_s=2)
    try:
        for _ in range(8):
            await busy.exec("true")
            await asyncio.sleep(0.5)
        ids = {i.id for i in await client.list()}
        assert idle.id not in ids and busy.id in ids
    finally:
        await busy.stop()


async def test_idle_pause_keeps_files(client):
    sb = await client.create(memory_mb=64, idle_ttl_s=1, on_idle="pause")
    try:
        await sb.files.write("/tmp/f", b"kept")
        for _ in range(20):
            if (await sb.refresh()).state == "paused":
                break
            await asyncio.sleep(0.3)
        assert sb.info.state == "paused"
        assert await sb.files.read("/tmp/f") == b"kept"
    finally:
        await sb.stop()


async def test_a_deep_state_dir_still_reaches_the_agent(tmp_path):
    from tests.support.server import ServerProcess
    deep = tmp_path / ("d" * 60) / ("e" * 60)  # agent.sock path past sun_path's 108 bytes
    deep.mkdir(parents=True)
    srv = ServerProcess(state_dir=deep).start()
    try:
        async with dsec.AsyncClient(srv.url, srv.token) as c:
            sb = await c.create(memory_mb=64)
            assert (await sb.exec("echo deep")).stdout == "deep\n"
            await sb.stop()
    finally:
        srv.destroy()


def _left_of(pid: int) -> str | None:
    """What is left of process ``pid``: its /proc state line (``Z`` for a zombie), or None."""
    try:
        comm, rest = open(f"/proc/{pid}/stat").read().rsplit(")", 1)
    except OSError:
        return None
    return f"{comm}) state {rest.split()[0]} parent {rest.split()[1]}"


async def test_stop_returns_once_the_sandbox_init_is_reaped(client, server):
    sbs = await client.create_many(3, memory_mb=64)
    inits = []
    for sb in sbs:
        await sb.exec("sleep 1000", background=True)
        inits.append(int((server.state_dir / "sandboxes" / sb.id / "init.pid").read_text()))
    for sb, pid in zip(sbs, inits):
        assert _left_of(pid) is not None
        await sb.stop()
        # Before: the init was the host init's orphan, a zombie until that reaped it.
        assert _left_of(pid) is None


async def test_idle_ttl_counts_a_running_exec_as_activity_and_its_end_too(client):
    sb = await client.create(memory_mb=64, idle_ttl_s=2)
    try:
        # Before: the sandbox expired 2 s into this exec, which then failed.
        r = await sb.exec("sleep 6; echo done", timeout=60)
        assert r.stdout == "done\n"
        assert (await sb.refresh()).state == "running"  # its end is activity
        deadline = time.time() + 60
        while time.time() < deadline:
            if sb.id not in {i.id for i in await client.list()}:
                break
            await asyncio.sleep(0.3)
        with pytest.raises(dsec.DSecError, match="idle_ttl_s"):
            await sb.exec("true")
    finally:
        try:
            await sb.stop()
        except dsec.NotFound:
            pass


async def test_request_id_makes_retries_return_the_first_sandboxes_and_nothing_else(client):
    """Real containers: a retried create or batch returns what the first attempt made; a
    retry asking for another sandbox (another size) with the same key is a Conflict, not
    the first one handed over; a shorter batch retry returns only the items it asks for."""
    key = f"lifecycle-{time.monotonic_ns()}"
    one = await client.create(memory_mb=64, request_id=key)
    try:
        assert (await client.create(memory_mb=64, request_id=key)).id == one.id
        with pytest.raises(dsec.Conflict, match="memory_mb 64, not 128"):
            await client.create(memory_mb=128, request_id=key)
        batch = await client.create_many(3, memory_mb=64, request_id=key + "-b")
        again = await client.create_many(3, memory_mb=64, request_id=key + "-b")
        assert [s.id for s in again] == [s.id for s in batch]
        fewer = await client.create_many(2, memory_mb=64, request_id=key + "-b")
        assert [s.id for s in fewer] == [s.id for s in batch[:2]]
        with pytest.raises(dsec.Conflict, match="memory_mb 64, not 128"):
            await client.create_many(3, memory_mb=128, request_id=key + "-b")
        listed = await client.list()
        assert sum(i.request_id is not None and i.request_id.startswith(key)
                   for i in listed) == 4  # the single create and the batch's 3, no more
    finally:
        ours = [i for i in await client.list() if (i.request_id or "").startswith(key)]
        for info in ours:
            await (await client.get(info.id)).stop()
