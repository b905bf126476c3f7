"""Shell sessions keep cwd and environment; a timed-out command does not end the session."""

import pytest

import dsec


async def test_cwd_and_exports_persist(sandbox):
    sh = await sandbox.shell()
    await sh.run("mkdir -p /repo && cd /repo && export X=1")
    r = await sh.run("pwd; echo $X")
    assert r.stdout == "/repo\n1\n" and r.exit_code == 0


async def test_exit_code_and_streams_per_command(sandbox):
    sh = await sandbox.shell()
    r = await sh.run("echo out; echo err >&2; false")
    assert (r.exit_code, r.stdout, r.stderr) == (1, "out\n", "err\n")
    r = await sh.run("printf 'no newline'")
    assert r.stdout == "no newline"


async def test_timeout_interrupts_without_losing_the_session(sandbox):
    sh = await sandbox.shell()
    await sh.run("export KEEP=yes")
    r = await sh.run("sleep 100", timeout=1)
    assert r.timed_out
    r = await sh.run("echo $KEEP")
    assert r.stdout == "yes\n"


async def test_commands_cannot_swallow_the_next(sandbox):
    sh = await sandbox.shell()
    r = await sh.run("cat")  # stdin is /dev/null, so cat ends at once
    assert r.exit_code == 0
    assert (await sh.run("echo next")).stdout == "next\n"


async def test_closed_shell_is_not_found(sandbox):
    sh = await sandbox.shell()
    await sh.close()
    with pytest.raises(dsec.NotFound):
        await sh.run("true")
