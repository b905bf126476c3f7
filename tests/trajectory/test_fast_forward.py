"""Fast-forward through a real server: logged steps are answered, never run twice."""

import pytest

import dsec

COUNT = "echo run >> /tmp/runs; wc -l < /tmp/runs"


async def _runs(sb) -> int:
    return int((await sb.files.read("/tmp/runs")).decode().count("run"))


async def test_a_logged_step_is_answered_from_the_log(sandbox):
    first = await sandbox.exec(COUNT, step="ep0/t0")
    again = await sandbox.exec(COUNT, step="ep0/t0")
    assert again == first
    assert await _runs(sandbox) == 1


async def test_reconnected_client_replays_in_order_then_goes_live(server, sandbox):
    for i in range(3):
        await sandbox.exec(f"{COUNT} # {i}", step=f"t{i}")
    async with dsec.AsyncClient(server.url, server.token) as other:  # the "restarted" trainer
        sb = await other.attach(sandbox.id)
        replayed = [(await sb.exec(f"{COUNT} # {i}", step=f"t{i}")).stdout for i in range(3)]
        live = await sb.exec(f"{COUNT} # 3", step="t3")
    assert replayed == ["1\n", "2\n", "3\n"]
    assert live.stdout == "4\n"
    assert await _runs(sandbox) == 4


async def test_a_different_step_at_a_logged_position_diverges(sandbox):
    await sandbox.exec("true", step="a")
    await sandbox.exec("true", step="b")
    await sandbox.exec("true", step="a")  # replay starts at position 0
    with pytest.raises(dsec.TrajectoryDiverged):
        await sandbox.exec("echo something else", step="c")
    audit = await sandbox.audit()
    assert [r.kind for r in audit] == ["trajectory_diverged"]


async def test_shell_runs_and_streams_are_logged_and_replayed(sandbox):
    sh = await sandbox.shell()
    first = await sh.run("echo run >> /tmp/runs; cd /tmp; pwd", step="s0")
    assert (await sh.run("echo run >> /tmp/runs; cd /tmp; pwd", step="s0")) == first
    events = [ev async for ev in sandbox.exec_stream("echo run >> /tmp/runs; echo hi",
                                                     step="s1")]
    replayed = [ev async for ev in sandbox.exec_stream("echo run >> /tmp/runs; echo hi",
                                                       step="s1")]
    assert replayed[-1].result == events[-1].result
    assert "".join(e.data for e in replayed if e.type == "stdout") == "hi\n"
    assert await _runs(sandbox) == 2


async def test_file_writes_are_in_the_log(sandbox):
    await sandbox.files.write("/tmp/a.txt", b"hello")
    await sandbox.exec("cat /tmp/a.txt", step="k")
    page = await sandbox.trajectory()
    assert [(e.kind, e.step) for e in page.entries] == [("file_write", None), ("exec", "k")]
    assert page.entries[0].request["size"] == 5
    assert page.entries[1].result["stdout"] == "hello"


async def test_a_paused_sandbox_is_fast_forwarded_without_resuming(sandbox):
    await sandbox.exec(COUNT, step="p0")
    await sandbox.pause()
    await sandbox.exec(COUNT, step="p0")
    assert (await sandbox.refresh()).state == "paused"


async def test_a_retried_step_still_running_is_not_run_twice(sandbox):
    import asyncio
    cmd = "sleep 0.5; " + COUNT
    a, b = await asyncio.gather(sandbox.exec(cmd, step="slow"), sandbox.exec(cmd, step="slow"))
    assert a == b and a.stdout == "1\n"
    assert await _runs(sandbox) == 1
