"""exec through SDK + HTTP + node + agent, in a real runc container."""

import asyncio

import pytest

import dsec


async def test_issue_example(client):
    sb = await client.create(backend="container", image="busybox", cpu=1, memory_mb=256)
    try:
        r = await sb.exec("echo hi; echo err >&2; exit 3", timeout=10)
        assert (r.exit_code, r.stdout, r.stderr) == (3, "hi\n", "err\n")
    finally:
        await sb.stop()


async def test_argv_is_not_shell_parsed(sandbox):
    r = await sandbox.exec(["echo", "$HOME", "a b"])
    assert r.stdout == "$HOME a b\n"


async def test_cwd_env_and_stdin(sandbox):
    r = await sandbox.exec("pwd; echo $FOO; cat", cwd="/tmp", env={"FOO": "bar"},
                           stdin=b"from stdin")
    assert r.stdout == "/tmp\nbar\nfrom stdin"


async def test_stdin_larger_than_the_pipes_while_output_flows_back(sandbox):
    # The agent must keep draining stdout while stdin waits for room in the command's pipe:
    # `cat` blocks on a full stdout as soon as more than the pipes hold is in flight.
    data = "0123456789abcdef" * (1 << 16)  # 1 MiB
    r = await sandbox.exec(["sh", "-c", "cat | wc -c; cat /dev/null"], stdin=data.encode(),
                           timeout=60)
    assert r.stdout.strip() == str(len(data))
    r = await sandbox.exec(["cat"], stdin=data.encode(), timeout=60)
    assert r.exit_code == 0 and r.stdout == data


async def test_user_by_name_and_uid(sandbox):
    assert (await sandbox.exec("id -u", user="nobody")).stdout.strip() == "65534"
    assert (await sandbox.exec("id -u; id -g", user="1234:4321")).stdout.split() == ["1234",
                                                                                       "4321"]
    with pytest.raises(dsec.InvalidArgument, match="not in the sandbox's /etc/passwd"):
        await sandbox.exec("true", user="nosuchuser")


async def test_command_not_found_is_127_not_an_error(sandbox):
    r = await sandbox.exec(["no-such-command"])
    assert r.exit_code == 127 and "not found" in r.stderr
    r = await sandbox.exec("no-such-command")
    assert r.exit_code == 127


async def test_timeout_kills_the_whole_process_group(sandbox):
    r = await sandbox.exec("sleep 300 & sleep 301; echo never", timeout=1)
    assert r.timed_out and r.exit_code == 137 and "never" not in r.stdout
    ps = await sandbox.exec("ps -o args")
    assert "sleep 30" not in ps.stdout


async def test_endless_output_is_capped_and_timed_out(sandbox):
    r = await sandbox.exec("yes", timeout=2, max_output=1000)
    assert r.timed_out and r.stdout_truncated and len(r.stdout) == 1000
    assert (await sandbox.exec("echo still fine")).stdout == "still fine\n"


async def test_output_cap_keeps_exit_code(sandbox):
    r = await sandbox.exec("head -c 5000 /dev/zero | tr '\\0' x; exit 4", max_output=100)
    assert r.exit_code == 4 and r.stdout == "x" * 100 and r.stdout_truncated
    assert not r.stderr_truncated


async def test_background_process_keeps_running(sandbox):
    r = await sandbox.exec("sleep 123", background=True)
    assert r.exit_code == 0 and r.pid
    assert "sleep 123" in (await sandbox.exec("ps -o args")).stdout


async def test_exec_stream_yields_chunks_before_exit(sandbox):
    events = [ev async for ev in sandbox.exec_stream(
        "echo one; sleep 0.3; echo two >&2; exit 5")]
    kinds = [e.type for e in events]
    assert kinds[-1] == "exit" and events[-1].result.exit_code == 5
    assert ("stdout", "one\n") in [(e.type, e.data) for e in events]
    assert ("stderr", "two\n") in [(e.type, e.data) for e in events]


async def test_concurrent_execs_in_one_sandbox(sandbox):
    results = await asyncio.gather(*(sandbox.exec(f"echo {i}") for i in range(20)))
    assert sorted(int(r.stdout) for r in results) == list(range(20))


async def test_unknown_sandbox_is_not_found(client):
    with pytest.raises(dsec.NotFound):
        await (await client.get("sb-nothere-000000000000")).exec("true")


def test_sync_client_has_the_same_behaviour(sync_client):
    sb = sync_client.create(memory_mb=128)
    try:
        r = sb.exec("echo hi; exit 2")
        assert (r.exit_code, r.stdout) == (2, "hi\n")
        assert [e.type for e in sb.exec_stream("echo x")][-1] == "exit"
    finally:
        sb.stop()
