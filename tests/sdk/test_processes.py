"""Background processes with a handle, output callbacks, the SDK pty, and a sandbox's
timeout (extended, and an expired sandbox saying so), on the session's real server."""

from __future__ import annotations

import asyncio
import time

import pytest

import dsec


async def test_spawn_keeps_output_and_waits(sandbox):
    proc = await sandbox.spawn("echo one; sleep 0.3; echo two >&2; exit 4")
    assert proc.pid > 0 and proc.info.running
    result = await proc.wait()
    assert (result.exit_code, result.stdout, result.stderr) == (4, "one\n", "two\n")
    again = await sandbox.process(proc.pid)  # a handle made from the pid alone
    info = await again.refresh()
    assert not info.running and info.stdout == "one\n" and info.result.exit_code == 4


async def test_callbacks_get_every_chunk(sandbox):
    seen: list[tuple[str, str]] = []

    async def on_err(text: str) -> None:  # async callbacks are awaited
        seen.append(("err", text))

    proc = await sandbox.spawn("for i in 1 2 3; do echo $i; sleep 0.1; done; echo e >&2",
                               on_stdout=lambda t: seen.append(("out", t)), on_stderr=on_err)
    await proc.wait()  # returns after the last callback
    assert "".join(t for k, t in seen if k == "out") == "1\n2\n3\n"
    assert [t for k, t in seen if k == "err"] == ["e\n"]

    chunks: list[str] = []
    r = await sandbox.exec("echo a; echo b", on_stdout=chunks.append)
    assert "".join(chunks) == "a\nb\n" and r.stdout == "a\nb\n" and r.exit_code == 0
    streamed: list[str] = []
    events = [ev async for ev in sandbox.exec_stream("echo s", on_stdout=streamed.append)]
    assert streamed == ["s\n"] and events[-1].type == "exit"


async def test_kill_list_stdin_and_reconnect_from_another_client(sandbox, server):
    long = await sandbox.spawn("sleep 300")
    reader = await sandbox.spawn("read line; echo got:$line", stdin_open=True)
    async with dsec.AsyncClient(server.url, server.token) as other:
        sb2 = await other.get(sandbox.id)
        pids = {p.pid for p in await sb2.processes()}
        assert {long.pid, reader.pid} <= pids
        handle = await sb2.process(reader.pid)
        await handle.send_stdin("hello\n")
        assert (await handle.wait()).stdout == "got:hello\n"
        await (await sb2.process(long.pid)).kill()
    result = await long.wait()
    assert result.exit_code != 0  # killed by SIGKILL
    with pytest.raises(dsec.NotFound, match="pid 999999"):
        await sandbox.process(999999)


async def test_wait_with_timeout_and_stream_replay(sandbox):
    proc = await sandbox.spawn("echo early; sleep 300")
    with pytest.raises(dsec.SandboxTimeout, match="still runs"):
        await proc.wait(timeout=0.2)
    first = None
    async for ev in proc.stream():  # replays what was kept, then follows
        first = ev
        break
    assert first is not None and (first.type, first.data) == ("stdout", "early\n")
    await proc.kill()
    events = [ev async for ev in proc.stream()]
    assert events[0].data == "early\n" and events[-1].type == "exit"


def test_sync_face_process_and_pty(sync_client):
    sb = sync_client.create(memory_mb=128)
    try:
        proc = sb.spawn("echo sync")
        assert isinstance(proc, dsec.Process)
        assert proc.wait().stdout == "sync\n"
        pty = sb.pty(rows=30, cols=100)
        assert isinstance(pty, dsec.Pty)
        pty.write("stty size; exit 7\n")
        seen = b""
        while chunk := pty.read(timeout=30):
            seen += chunk
        assert b"30 100" in seen and pty.exit_code == 7
    finally:
        sb.stop()


async def test_pty_resize_and_wait(sandbox):
    pty = await sandbox.pty()
    await pty.resize(33, 77)
    await pty.write("stty size\n")
    seen = b""
    while b"33 77" not in seen:
        seen += await pty.read(timeout=30)
    await pty.write("exit 3\n")
    assert await pty.wait(timeout=30) == 3
    assert await pty.read() == b""


async def test_set_timeout_extends_and_expiry_is_named(client):
    sb = await client.create(memory_mb=64, ttl_s=3600)
    info = await sb.set_timeout(7200)
    assert info.expires_at is not None and info.expires_at > time.time() + 3600
    info = await sb.set_timeout(0.5)
    deadline = time.time() + 60
    while True:  # the node's reaper stops it within a pass or two
        try:
            await sb.exec("true")
        except dsec.SandboxStopped as exc:
            assert "expired" in str(exc) and "set_timeout" in str(exc)
            break
        assert time.time() < deadline, "the sandbox did not expire"
        await asyncio.sleep(0.2)
    with pytest.raises(dsec.SandboxStopped, match="expired"):
        await sb.refresh()
    await sb.stop()  # stopping an expired sandbox is already done, not an error
    with pytest.raises(dsec.InvalidArgument, match="timeout_s"):
        await sb.set_timeout(-1)


async def test_stopping_the_sandbox_ends_its_waiters(client):
    sb = await client.create(memory_mb=64)
    proc = await sb.spawn("sleep 300")
    waiter = asyncio.create_task(proc.wait())
    await asyncio.sleep(0.5)  # let the wait reach the node first (either order must end)
    await sb.stop()
    try:
        result = await asyncio.wait_for(waiter, 60)  # a waiter left hanging fails here
    except (dsec.NotFound, dsec.SandboxStopped):
        return  # the wait arrived after the stop
    assert result.exit_code == -1


async def test_files_exists(sandbox):
    await sandbox.files.write("/tmp/here", b"x")
    assert await sandbox.files.exists("/tmp/here")
    assert not await sandbox.files.exists("/tmp/not-here")


async def test_unknown_sandbox_is_still_not_found(client):
    with pytest.raises(dsec.NotFound):
        await client.get("sb-0000-neverwas")
