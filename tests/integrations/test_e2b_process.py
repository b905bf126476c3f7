"""The unmodified e2b SDK's stdin, reattachment (commands.connect) and PTY calls against a
real dsec server (busybox containers; the SDK's ``/bin/bash`` runs as busybox's sh)."""

from __future__ import annotations

import asyncio

import pytest
from e2b import (AsyncSandbox, CommandExitException, NotFoundException, Sandbox,
                 SandboxException)
from e2b.sandbox.commands.command_handle import PtySize


@pytest.fixture
def sbx(e2b_env):
    sb = Sandbox.create(template="busybox", timeout=300)
    yield sb
    sb.kill()


def _pty_until(handle, needle: bytes) -> bytes:
    """Terminal output of ``handle`` up to and including ``needle``."""
    seen = b""
    for _, _, pty in handle:
        if pty:
            seen += pty
            if needle in seen:
                return seen
    raise AssertionError(f"the terminal ended before {needle!r}; it showed {seen!r}")


# ---- stdin ----

def test_send_stdin_reaches_a_background_command(sbx):
    h = sbx.commands.run("read line; echo got:$line", background=True, stdin=True)
    sbx.commands.send_stdin(h.pid, "hello\n")
    assert h.wait().stdout == "got:hello\n"


def test_close_stdin_ends_the_input(sbx):
    h = sbx.commands.run("cat; echo end", background=True, stdin=True)
    h.send_stdin("abc")
    h.close_stdin()
    assert h.wait().stdout == "abcend\n"


def test_stream_input_sends_chunks_in_order(sbx):
    h = sbx.commands.run("cat", background=True, stdin=True)
    sbx.commands.stream_input(h.pid, ["one ", b"two ", "three"])
    sbx.commands.close_stdin(h.pid)
    assert h.wait().stdout == "one two three"


def test_stdin_to_a_command_started_without_it_is_refused(sbx):
    h = sbx.commands.run("sleep 60", background=True)
    with pytest.raises(SandboxException) as exc:
        sbx.commands.send_stdin(h.pid, "x")
    assert "stdin" in str(exc.value)
    h.kill()


# ---- reattaching ----

def test_connect_follows_a_command_from_another_client(sbx):
    h = sbx.commands.run("echo first; read x; echo second:$x", background=True, stdin=True)
    other = Sandbox.connect(sbx.sandbox_id)
    again = other.commands.connect(h.pid)
    assert again.pid == h.pid
    other.commands.send_stdin(h.pid, "z\n")
    r = again.wait()  # the kept output from the start, then the rest
    assert (r.exit_code, r.stdout) == (0, "first\nsecond:z\n")
    assert h.wait().stdout == "first\nsecond:z\n"


def test_connect_after_the_start_stream_was_dropped(sbx):
    h = sbx.commands.run("read x; echo got:$x; exit 4", background=True, stdin=True)
    pid = h.pid
    h.disconnect()  # the command goes on without the stream that started it
    again = sbx.commands.connect(pid)
    again.send_stdin("y\n")
    with pytest.raises(CommandExitException) as exc:
        again.wait()
    assert (exc.value.exit_code, exc.value.stdout) == (4, "got:y\n")


def test_connect_to_an_unknown_pid_is_not_found(sbx):
    with pytest.raises(NotFoundException):
        sbx.commands.connect(99999)


# ---- PTY ----

def test_pty_echoes_input_and_resizes(sbx):
    term = sbx.pty.create(PtySize(rows=24, cols=80))
    sbx.pty.send_stdin(term.pid, b"stty size\n")
    assert b"24 80" in _pty_until(term, b"24 80")
    sbx.pty.resize(term.pid, PtySize(rows=30, cols=100))
    sbx.pty.send_stdin(term.pid, b"stty size; exit 3\n")
    assert b"30 100" in _pty_until(term, b"30 100")
    with pytest.raises(CommandExitException) as exc:
        term.wait()
    assert exc.value.exit_code == 3


def test_pty_is_killed_by_pid(sbx):
    term = sbx.pty.create(PtySize(rows=24, cols=80))
    assert sbx.pty.kill(term.pid) is True
    with pytest.raises(CommandExitException):
        term.wait()
    assert sbx.pty.kill(term.pid) is False


def test_resizing_a_command_without_a_terminal_is_refused(sbx):
    h = sbx.commands.run("sleep 60", background=True)
    with pytest.raises(SandboxException) as exc:
        sbx.pty.resize(h.pid, PtySize(rows=10, cols=10))
    assert "terminal" in str(exc.value)
    h.kill()


def test_async_sdk_stdin_connect_and_pty(e2b_env):
    async def main() -> None:
        sb = await AsyncSandbox.create(template="busybox", timeout=300)
        try:
            h = await sb.commands.run("read x; echo a:$x", background=True, stdin=True)
            again = await sb.commands.connect(h.pid)
            await sb.commands.send_stdin(h.pid, "q\n")
            assert (await again.wait()).stdout == "a:q\n"
            seen = bytearray()
            done = asyncio.Event()

            def on_data(data: bytes) -> None:
                seen.extend(data)
                if b"12 34" in seen:
                    done.set()

            term = await sb.pty.create(PtySize(rows=5, cols=5), on_data=on_data)
            await sb.pty.resize(term.pid, PtySize(rows=12, cols=34))
            await sb.pty.send_stdin(term.pid, b"stty size\n")
            await asyncio.wait_for(done.wait(), 60)
            await sb.pty.send_stdin(term.pid, b"exit\n")
            assert (await term.wait()).exit_code == 0
        finally:
            await sb.kill()

    asyncio.run(main())
