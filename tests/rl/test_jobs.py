"""Job lifecycle through a real server: pause, transparent resume, leases, stop."""

import asyncio
import secrets
import time

import pytest

import dsec


async def _wait_states(client, job: str, want: dict[str, int], timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if (await client.jobs.get(job)).states == want:
                return
        except dsec.NotFound:
            if not want:
                return
        await asyncio.sleep(0.3)
    raise AssertionError(f"job {job} never reached {want}")


@pytest.fixture
async def job(client):
    name = f"job-{secrets.token_hex(4)}"
    sbs = await client.create_many(3, memory_mb=128, job=name)
    yield name, sbs
    await client.jobs.stop(name)


async def test_pause_freezes_every_sandbox_and_a_request_resumes_one(client, job):
    name, sbs = job
    await sbs[0].exec("echo kept > /tmp/f")
    info = await client.jobs.pause(name)
    assert info.states == {"paused": 3}
    r = await sbs[0].exec("cat /tmp/f")
    assert r.stdout == "kept\n"
    assert (await client.jobs.get(name)).states == {"paused": 2, "running": 1}


async def test_attach_by_job_returns_every_sandbox(client, job):
    name, sbs = job
    attached = await client.jobs.attach(name)
    assert sorted(sb.id for sb in attached) == sorted(sb.id for sb in sbs)


async def test_jobs_list_counts_and_reserves(client, job):
    name, _ = job
    [info] = [j for j in await client.jobs.list() if j.job == name]
    assert (info.sandboxes, info.memory_mb) == (3, 384)
    assert info.memory_used_mb > 0


async def test_stop_removes_the_whole_job(client, job):
    name, sbs = job
    await client.jobs.stop(name)
    with pytest.raises(dsec.NotFound):
        await client.jobs.get(name)
    with pytest.raises(dsec.NotFound):
        await sbs[0].exec("true")


async def test_a_lapsed_lease_pauses_then_stops_the_job(client, job):
    name, sbs = job
    info = await client.jobs.heartbeat(name, lease_s=0.5, stop_after_s=3)
    assert info.lease_expires_at is not None
    await _wait_states(client, name, {"paused": 3})
    await _wait_states(client, name, {})
    with pytest.raises(dsec.NotFound):
        await sbs[1].refresh()


async def test_a_heartbeat_keeps_the_job_running(client, job):
    name, _ = job
    for _ in range(4):
        await client.jobs.heartbeat(name, lease_s=30)
        await asyncio.sleep(0.5)
    assert (await client.jobs.get(name)).states == {"running": 3}


async def test_idle_sandbox_is_paused_with_its_files(client):
    sb = await client.create(memory_mb=128, idle_ttl_s=1, on_idle="pause")
    try:
        await sb.exec("echo kept > /tmp/f")
        deadline = time.time() + 60
        while (await sb.refresh()).state != "paused":
            assert time.time() < deadline, "never paused"
            await asyncio.sleep(0.3)
        assert (await sb.exec("cat /tmp/f")).stdout == "kept\n"
    finally:
        await sb.stop()
