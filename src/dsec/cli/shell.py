"""``dsec shell``: an interactive terminal in a sandbox over the gateway's pty WebSocket.

Frames: binary both ways carry terminal bytes; the client sends text ``{"resize":[r,c]}``;
the server ends with text ``{"exit": code}`` (or an error body if the pty could not start).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from typing import Annotated

import typer
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

import dsec
from dsec.api.errors import SandboxStopped, error_from_wire
from dsec.cli.common import cli_errors, exit_status, fail
from dsec.cli.terminal import RawTerminal, terminal_size
from dsec.sdk.client import default_token, default_url
from dsec.sdk.pty import open_pty

__all__ = ["shell", "run_pty"]

CTRL_D = b"\x04"
# Silence after output taken to mean the shell printed its prompt and waits at it, where a
# Ctrl-D ends it (the end of piped input, see _eof).
QUIET_S = 0.2


@cli_errors
def shell(sandbox_id: Annotated[str, typer.Argument(metavar="ID", help="sandbox id")]) -> None:
    """Open an interactive shell in a sandbox; leave with `exit` or Ctrl-D. Piped input
    (`dsec shell ID < script`) ends the session at its end, with the shell's status."""
    with dsec.Client() as client:
        client.get(sandbox_id)  # an unknown id fails here, before the terminal changes
    try:
        code = asyncio.run(run_pty(default_url(), default_token(), sandbox_id,
                                   sys.stdin.fileno(), sys.stdout.fileno()))
    except OSError as exc:
        fail(f"cannot open the terminal connection: {exc}")
    raise typer.Exit(code)


async def run_pty(url: str, token: str | None, sandbox_id: str, in_fd: int, out_fd: int) -> int:
    """Relay ``in_fd``/``out_fd`` to a pty in the sandbox until its shell exits; returns
    the shell's exit code. A terminal on ``in_fd`` is in raw mode meanwhile."""
    rows, cols = terminal_size(in_fd, out_fd)
    ws = await open_pty(url, token, sandbox_id, rows, cols)  # the SDK's sb.pty() connection
    async with ws:
        with RawTerminal(in_fd):
            return await _relay(ws, in_fd, out_fd)


async def _relay(ws: ClientConnection, in_fd: int, out_fd: int) -> int:
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[bytes] = asyncio.Queue()
    ended = asyncio.Event()
    got_signal: list[int] = []
    resizes: set[asyncio.Task] = set()  # held so a pending resize is not collected
    output = asyncio.Event()  # set at each piece of output, for the end of piped input

    def on_signal(sig: int) -> None:
        got_signal.append(sig)
        ended.set()

    def on_resize() -> None:
        rows, cols = terminal_size(in_fd, out_fd)
        task = asyncio.create_task(_send(ws, json.dumps({"resize": [rows, cols]})))
        resizes.add(task)
        task.add_done_callback(resizes.discard)

    watching = _watch_input(loop, in_fd, inbox)
    loop.add_signal_handler(signal.SIGWINCH, on_resize)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, on_signal, sig)
    tasks = [asyncio.create_task(_receive(ws, out_fd, output)),
             asyncio.create_task(_forward(ws, inbox, output, tty=os.isatty(in_fd))),
             asyncio.create_task(ended.wait())]
    try:
        await asyncio.wait([tasks[0], tasks[2]], return_when=asyncio.FIRST_COMPLETED)
        if got_signal:
            return 128 + got_signal[0]
        return tasks[0].result()
    finally:
        for t in tasks:
            t.cancel()
        for sig in (signal.SIGWINCH, signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        if watching:
            loop.remove_reader(in_fd)


def _watch_input(loop: asyncio.AbstractEventLoop, fd: int, inbox: asyncio.Queue[bytes]) -> bool:
    """Queue what arrives on ``fd`` (b"" at its end); True if a reader was installed."""
    def readable() -> None:
        try:
            chunk = os.read(fd, 1 << 16)
        except OSError:  # the terminal hung up
            chunk = b""
        if not chunk:
            loop.remove_reader(fd)
        inbox.put_nowait(chunk)

    try:
        loop.add_reader(fd, readable)
        return True
    except PermissionError:  # a regular file or /dev/null: epoll refuses, reads never block
        while chunk := os.read(fd, 1 << 16):
            inbox.put_nowait(chunk)
        inbox.put_nowait(b"")
        return False


async def _forward(ws: ClientConnection, inbox: asyncio.Queue[bytes], output: asyncio.Event,
                   tty: bool) -> None:
    """Local input to the sandbox. At the end of piped input, end the shell (:func:`_eof`)."""
    last = b"\n"
    while True:
        chunk = await inbox.get()
        if not chunk:
            if not tty:
                await _eof(ws, output, unfinished=not last.endswith(b"\n"))
            return
        last = chunk
        await _send(ws, chunk)


async def _eof(ws: ClientConnection, output: asyncio.Event, unfinished: bool) -> None:
    """Type Ctrl-D until the shell exits, as a pipe's end would end ``sh < file``.

    A pty has no end of input, only a Ctrl-D, which is one keystroke for whoever reads
    then: the shell exits on it only at its prompt, with an empty line; a command running
    meanwhile takes it as its own end of input (``cat``), or the terminal drops it. So
    after each Ctrl-D wait for the sandbox to print (a prompt) and fall quiet, then type
    it again; a command that runs silently for long is not sent a stream of them."""
    if unfinished:  # the last line has no newline: run it, as sh does at end of a file
        await _send(ws, b"\n")
    while True:
        output.clear()
        await _send(ws, CTRL_D)
        await output.wait()
        while True:
            output.clear()
            try:
                await asyncio.wait_for(output.wait(), QUIET_S)
            except TimeoutError:
                break


async def _send(ws: ClientConnection, message: bytes | str) -> None:
    try:
        await ws.send(message)
    except ConnectionClosed:
        pass  # the receiver reports how the session ended


async def _receive(ws: ClientConnection, out_fd: int, output: asyncio.Event) -> int:
    """Sandbox output to ``out_fd`` until the exit frame; returns the exit code."""
    try:
        async for message in ws:
            if isinstance(message, bytes):
                _write_all(out_fd, message)
                output.set()
                continue
            ctl = json.loads(message)
            if "exit" in ctl:
                code = ctl["exit"]
                return exit_status(code) if isinstance(code, int) else 1
            if "error" in ctl:
                raise error_from_wire(ctl, 500)
    except ConnectionClosed:
        pass
    _write_all(out_fd, b"\r\n")  # the error line should not continue the prompt's line
    raise SandboxStopped("the terminal connection closed before the shell exited "
                         "(was the sandbox stopped?)")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
