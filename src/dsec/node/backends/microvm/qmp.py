"""A minimal QMP (QEMU Machine Protocol) client: one command per call, events kept aside.

Each call opens the QMP unix socket, negotiates, runs one command and closes: the node may
restart at any time, so holding no long-lived connection keeps nothing to recover.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from dsec.api.errors import Internal

__all__ = ["QMPError", "qmp", "qmp_many", "qmp_sync"]


class QMPError(Internal):
    """QEMU answered a command with an error, or its control socket is gone."""


async def _read(reader: asyncio.StreamReader, events: list[dict]) -> dict:
    while True:
        line = await reader.readline()
        if not line:
            raise QMPError("QEMU closed its control socket")
        msg = json.loads(line)
        if "event" in msg:
            events.append(msg)
            continue
        return msg


async def qmp_many(sock: Path, commands: list[tuple[str, dict | None]],
                   timeout: float = 10.0, pause_s: float = 0.0) -> list:
    """Run ``commands`` (name, arguments) in order on one connection; return their results.

    ``pause_s``: wait between commands (input events a slow guest must keep up with)."""
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_unix_connection(str(sock), limit=1 << 24), timeout)
    except (OSError, asyncio.TimeoutError) as exc:
        raise QMPError(f"QEMU control socket {sock} unreachable: {exc}") from exc
    events: list[dict] = []
    try:
        async def run() -> list:
            await _read(reader, events)  # greeting
            out = []
            for i, (name, args) in enumerate([("qmp_capabilities", None), *commands]):
                if i > 1 and pause_s:
                    await asyncio.sleep(pause_s)
                msg = {"execute": name, **({"arguments": args} if args else {})}
                writer.write(json.dumps(msg).encode() + b"\n")
                reply = await _read(reader, events)
                if "error" in reply:
                    err = reply["error"]
                    raise QMPError(f"QEMU {name}: {err.get('class')}: {err.get('desc')}")
                out.append(reply.get("return"))
            return out[1:]

        return await asyncio.wait_for(run(), timeout)
    except asyncio.TimeoutError as exc:
        raise QMPError(f"QEMU did not answer {commands[0][0]!r} in {timeout:g}s") from exc
    finally:
        writer.close()


async def qmp(sock: Path, command: str, args: dict | None = None, timeout: float = 10.0):
    """Run one QMP command and return its ``return`` value."""
    return (await qmp_many(sock, [(command, args)], timeout))[0]


def qmp_sync(sock: Path, commands: list[tuple[str, dict | None]], send_fd: int | None = None,
             timeout: float = 10.0) -> list:
    """Blocking twin of :func:`qmp_many`. ``send_fd`` rides (SCM_RIGHTS) on the first
    command, which is how ``getfd`` hands QEMU a file it could not open itself."""
    import socket

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(str(sock))
        f = s.makefile("rb")
        events: list[dict] = []

        def read() -> dict:
            while True:
                line = f.readline()
                if not line:
                    raise QMPError("QEMU closed its control socket")
                msg = json.loads(line)
                if "event" not in msg:
                    return msg
                events.append(msg)

        read()  # greeting
        out = []
        for i, (name, args) in enumerate([("qmp_capabilities", None), *commands]):
            data = json.dumps({"execute": name, **({"arguments": args} if args else {})})
            if i == 1 and send_fd is not None:
                socket.send_fds(s, [data.encode() + b"\n"], [send_fd])
            else:
                s.sendall(data.encode() + b"\n")
            reply = read()
            if "error" in reply:
                err = reply["error"]
                raise QMPError(f"QEMU {name}: {err.get('class')}: {err.get('desc')}")
            out.append(reply.get("return"))
        return out[1:]
    except OSError as exc:
        raise QMPError(f"QEMU control socket {sock}: {exc}") from exc
    finally:
        s.close()
