"""The node's side of the dsec-agent wire protocol (see ``agent.c`` for the frame layout).

One connection runs one command. :class:`AgentProcess` is the handle on it: feed stdin,
send signals, and read ``(kind, bytes)`` events until the exit frame arrives.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from dsec.api.errors import Conflict

__all__ = ["AgentConnector", "AgentProcess", "AgentGone", "SpawnRequest", "unix_connector", "refusal",
           "ping", "kept_commands", "KeptCommand"]

HEADER = struct.Struct(">BII")
MAX_FRAME = 1 << 20

AgentConnector = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


class AgentGone(ConnectionError):
    """The agent closed the connection before reporting an exit."""


@dataclass
class SpawnRequest:
    """What the agent needs to start one command inside the sandbox."""

    argv: list[str]
    env: dict[str, str]
    cwd: str = "/"
    uid: int = 0
    gid: int = 0
    pty: bool = False
    rows: int = 24
    cols: int = 80
    detach: bool = False
    unconfined: bool = False  # guests only: the node's own housekeeping, never a user's exec
    keep: bool = False  # outlive the connection (a node restart): follow it again by pid
    tag: str = ""       # a kept command's note, handed back by kept_commands (ASCII)
    protect: list[str] = field(default_factory=list)  # hierarchies it may not read or write

    def encode(self) -> bytes:
        body = {
            "argv": self.argv,
            "env": [f"{k}={v}" for k, v in self.env.items()],
            "cwd": self.cwd,
            "uid": self.uid,
            "gid": self.gid,
            "pty": int(self.pty),
            "rows": self.rows,
            "cols": self.cols,
            "detach": int(self.detach),
            "unconfined": int(self.unconfined),
        }
        if self.keep:
            body.update(keep=1, tag=self.tag)
        if self.protect:  # only when set: an agent that predates the key reads no other
            body["protect"] = self.protect
        # ensure_ascii keeps the agent's parser to \uXXXX escapes; the C side maps those to
        # single bytes, so non-ASCII argv is sent pre-encoded as latin-1 code points.
        return json.dumps(_latin1_safe(body), ensure_ascii=True).encode()


PIDS_FULL = b"the sandbox's process limit (pids) is reached"


def refusal(payload: bytes):
    """Raise what an agent's 'F' frame means: a full process table is the sandbox's own
    doing (409, the sandbox is alive); anything else, the agent could not take it."""
    text = payload.decode(errors="replace")
    if payload == PIDS_FULL:
        raise Conflict(f"{text}: its processes hold every pid it may have; stop some (or "
                       "create it with a larger pids) and retry")
    raise AgentGone(f"agent refused the command: {text}")


def _latin1_safe(obj):
    if isinstance(obj, str):
        return obj.encode("utf-8", "surrogateescape").decode("latin-1")
    if isinstance(obj, list):
        return [_latin1_safe(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _latin1_safe(v) for k, v in obj.items()}
    return obj


def unix_connector(path: str) -> AgentConnector:
    async def connect():
        if len(path.encode()) < 100:
            return await asyncio.open_unix_connection(path, limit=MAX_FRAME * 2)
        # sun_path holds 108 bytes: reach a socket in a deep state dir through its dir's fd
        dirfd = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            short = f"/proc/self/fd/{dirfd}/{os.path.basename(path)}"
            return await asyncio.open_unix_connection(short, limit=MAX_FRAME * 2)
        finally:
            os.close(dirfd)

    return connect


def _frame(kind: bytes, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind[0], 0, len(payload)) + payload


class AgentProcess:
    """A command started by the agent; events come from :meth:`next_event`."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self.pid: int | None = None
        self.exit_code: int | None = None
        self.signal: int | None = None

    @classmethod
    async def start(cls, connector: AgentConnector, req: SpawnRequest,
                    no_stdin: bool = False) -> AgentProcess:
        """Start ``req``; with ``no_stdin`` its stdin is closed in the same write (one
        syscall and one wake-up of the agent fewer: it reads frame by frame, so the end
        of stdin waits in the socket until the command runs)."""
        try:
            reader, writer = await connector()
        except OSError as exc:
            raise AgentGone(f"sandbox agent unreachable: {exc}") from exc
        proc = cls(reader, writer)
        frames = _frame(b"S", req.encode())
        writer.write(frames + _frame(b"E") if no_stdin and not req.detach else frames)
        kind, payload = await proc._read_frame()
        if kind == b"F":
            proc.close()
            refusal(payload)
        if kind != b"P":
            proc.close()
            raise AgentGone(f"unexpected agent frame {kind!r}")
        proc.pid = int(payload)
        return proc

    @classmethod
    async def attach(cls, connector: AgentConnector, pid: int) -> AgentProcess:
        """Follow again kept command ``pid`` (after a node restart): the output the agent
        held while nobody followed comes first, then what comes."""
        try:
            reader, writer = await connector()
        except OSError as exc:
            raise AgentGone(f"sandbox agent unreachable: {exc}") from exc
        proc = cls(reader, writer)
        writer.write(_frame(b"T", str(pid).encode()))
        kind, payload = await proc._read_frame()
        if kind != b"P":
            proc.close()
            raise AgentGone(f"agent refused to attach to {pid}: "
                            f"{payload.decode(errors='replace')}")
        proc.pid = int(payload)
        return proc

    async def _read_frame(self) -> tuple[bytes, bytes]:
        try:
            hdr = await self._reader.readexactly(HEADER.size)
            kind, _chan, length = HEADER.unpack(hdr)
            if length > MAX_FRAME:
                raise AgentGone(f"agent frame too large: {length}")
            payload = await self._reader.readexactly(length) if length else b""
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            raise AgentGone("sandbox agent closed the connection") from exc
        return bytes([kind]), payload

    async def next_event(self) -> tuple[str, bytes]:
        """Return ``("stdout"|"stderr", data)`` or ``("exit", b"")`` once, at the end."""
        kind, payload = await self._read_frame()
        if kind == b"O":
            return "stdout", payload
        if kind == b"R":
            return "stderr", payload
        if kind == b"X":
            code, sig = payload.split()
            self.exit_code, self.signal = int(code), int(sig) or None
            self.close()
            return "exit", b""
        raise AgentGone(f"unexpected agent frame {kind!r}")

    def write_stdin(self, data: bytes) -> None:
        for i in range(0, len(data), MAX_FRAME):
            self._writer.write(_frame(b"I", data[i:i + MAX_FRAME]))

    def close_stdin(self) -> None:
        self._writer.write(_frame(b"E"))

    def send_signal(self, signum: int) -> None:
        if not self._writer.is_closing():
            self._writer.write(_frame(b"K", bytes([signum])))

    def signal_children(self, signum: int) -> None:
        """Signal every descendant of the command but not the command itself."""
        if not self._writer.is_closing():
            self._writer.write(_frame(b"C", bytes([signum])))

    def resize(self, rows: int, cols: int) -> None:
        self._writer.write(_frame(b"Z", f"{rows} {cols}".encode()))

    async def drain(self) -> None:
        try:
            await self._writer.drain()
        except ConnectionError as exc:
            raise AgentGone("sandbox agent closed the connection") from exc

    def close(self) -> None:
        if not self._writer.is_closing():
            self._writer.close()


@dataclass
class KeptCommand:
    """A kept command no connection follows (its follower went with a node restart)."""

    pid: int
    ended: bool
    tag: str


async def kept_commands(connector: AgentConnector) -> list[KeptCommand]:
    """The kept commands of a sandbox that nobody follows now."""
    try:
        reader, writer = await connector()
    except OSError as exc:
        raise AgentGone(f"sandbox agent unreachable: {exc}") from exc
    proc = AgentProcess(reader, writer)
    try:
        writer.write(_frame(b"L"))
        kind, payload = await proc._read_frame()
    finally:
        proc.close()
    if kind != b"L":
        raise AgentGone(f"unexpected agent frame {kind!r} to a list of kept commands")
    found = []
    for line in payload.decode("ascii", errors="replace").splitlines():
        pid, ended, tag = (line.split("\t", 2) + ["", ""])[:3]
        if pid.isdigit():
            found.append(KeptCommand(int(pid), ended == "1", tag))
    return found


async def ping(connector: AgentConnector, timeout: float = 2.0) -> bool:
    """True when an agent answers on ``connector`` within ``timeout`` seconds."""
    try:
        reader, writer = await asyncio.wait_for(connector(), timeout)
    except (OSError, asyncio.TimeoutError):
        return False
    try:
        writer.write(_frame(b"Q"))
        hdr = await asyncio.wait_for(reader.readexactly(HEADER.size), timeout)
        return hdr[0] == ord("A")
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
        return False
    finally:
        writer.close()
