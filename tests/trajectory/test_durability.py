"""The log and job leases outlive the node process: SIGKILL, restart, fast-forward."""

import pytest

import dsec
from tests.support.server import ServerProcess, leftovers

STEP = "echo run >> /tmp/runs; wc -l < /tmp/runs"


@pytest.fixture
def restartable():
    srv = ServerProcess().start()
    yield srv
    srv.destroy()
    assert leftovers(srv.state_dir) == []


async def test_steps_logged_before_a_crash_are_answered_after_it(restartable):
    srv = restartable
    async with dsec.AsyncClient(srv.url, srv.token) as c:
        sb = await c.create(memory_mb=128, job="job-durable")
        first = [await sb.exec(STEP, step=f"t{i}") for i in range(3)]
        await c.jobs.heartbeat("job-durable", lease_s=3600)
    srv.kill()
    srv.start()
    async with dsec.AsyncClient(srv.url, srv.token) as c:
        [sb] = await c.jobs.attach("job-durable")
        again = [await sb.exec(STEP, step=f"t{i}") for i in range(3)]
        live = await sb.exec(STEP, step="t3")
        assert again == first
        assert live.stdout == "4\n"
        assert (await c.jobs.get("job-durable")).lease_expires_at is not None
        await c.jobs.stop("job-durable")
