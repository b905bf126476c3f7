"""replay(log, into=...) re-runs a trajectory in a fresh sandbox and reports differences."""

from dsec.trajectory import load_log, replay


async def test_a_trajectory_rebuilds_the_same_state_in_a_fresh_sandbox(client, sandbox):
    await sandbox.files.write("/tmp/in.txt", b"3\n1\n2\n")
    await sandbox.exec("sort /tmp/in.txt > /tmp/out.txt", step="t0")
    sh = await sandbox.shell()
    await sh.run("cd /tmp && export N=$(wc -l < out.txt)", step="t1")
    await sh.run("echo $N lines in $PWD", step="t2")
    await sandbox.exec("cat /proc/sys/kernel/random/uuid", step="t3")  # differs every run
    log = await load_log(sandbox)
    fresh = await client.create(memory_mb=128)
    try:
        report = await replay(log, into=fresh)
        assert report.different == [4] and report.same == [0, 1, 2, 3] and not report.skipped
        assert (await fresh.files.read("/tmp/out.txt")) == b"1\n2\n3\n"
        assert [e.step for e in (await fresh.trajectory()).entries] == [
            None, "t0", "t1", "t2", "t3"]
    finally:
        await fresh.stop()


async def test_the_log_stays_readable_after_the_sandbox_stopped(client):
    sb = await client.create(memory_mb=128)
    await sb.exec("echo hi", step="only")
    await sb.stop()
    [entry] = await load_log(sb)
    assert (entry.step, entry.result["stdout"]) == ("only", "hi\n")
