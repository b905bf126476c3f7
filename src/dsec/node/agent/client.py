"""The node's side of the dsec-agent wire protocol (see ``agent.c`` for the frame layout).

One connection runs one command at a time. :class:`AgentProcess` is the handle on it: feed
stdin, send signals, and read ``(kind, bytes)`` events until the exit frame arrives. A
connector with an :class:`AgentPool` (containers) hands the connection of a plain command
that ended back to the pool, and the next command to that agent reuses it: no connect, no
accept and no new agent thread per exec.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from dsec.api.errors import Conflict

__all__ = ["AgentConnector", "AgentProcess", "AgentGone", "SpawnRequest", "unix_connector", "refusal",
           "ping", "kept_commands", "KeptCommand", "AgentPool"]

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
    # the grading step's: hierarchies whose names it may not link or move out (or in)
    nolink: list[str] = field(default_factory=list)

    def encode(self, reuse: bool = False) -> bytes:
        """The spawn frame's JSON; ``reuse``: the connection carries the next command."""
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
        elif self.nolink:
            body["nolink"] = self.nolink
        if reuse:
            body["reuse"] = 1
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


Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class AgentPool:
    """Idle connections to in-sandbox agents, by socket path, each with the agent thread
    that waits on it for the next command.

    Only a plain command's connection comes back (no stdin after the spawn, no pty, not
    kept or detached), and only once its exit frame was read: the agent drops every frame
    it gets between two commands, so nothing sent for the old one reaches the next. At
    most ``per_path`` idle connections per agent (each idle one holds a thread, which
    counts against the sandbox's pids), none older than ``idle_s`` (the agent closes
    its side after 60 s)."""

    def __init__(self, per_path: int = 2, idle_s: float = 20.0) -> None:
        self.per_path = per_path
        self.idle_s = idle_s
        self._idle: dict[str, deque[tuple[float, asyncio.AbstractEventLoop, Conn]]] = {}
        self._puts = 0

    def take(self, path: str) -> Conn | None:
        """An idle connection to the agent at ``path`` still open, or None."""
        idle = self._idle.get(path)
        loop = asyncio.get_running_loop()
        while idle:
            t, owner, conn = idle.pop()
            if owner is loop and self._fresh(t, conn):
                return conn
            _close(conn)
        self._idle.pop(path, None)
        return None

    def put(self, path: str, conn: Conn) -> None:
        """Keep ``conn`` for the next command to ``path``."""
        idle = self._idle.setdefault(path, deque())
        if len(idle) >= self.per_path or not self._fresh(time.monotonic(), conn):
            _close(conn)
        else:
            idle.append((time.monotonic(), asyncio.get_running_loop(), conn))
        self._puts += 1
        if self._puts % 1024 == 0:
            self.sweep()

    def drop(self, path: str) -> None:
        """Close the idle connections to ``path`` (its sandbox stops)."""
        for _t, _loop, conn in self._idle.pop(path, ()):
            _close(conn)

    def sweep(self) -> None:
        """Close every idle connection that is too old or whose agent went away."""
        for path in list(self._idle):
            keep = deque(e for e in self._idle[path] if self._fresh(e[0], e[2]))
            for e in self._idle[path]:
                if e not in keep:
                    _close(e[2])
            if keep:
                self._idle[path] = keep
            else:
                del self._idle[path]

    def _fresh(self, t: float, conn: Conn) -> bool:
        reader, writer = conn
        return (time.monotonic() - t < self.idle_s and not reader.at_eof()
                and not writer.is_closing())


def _close(conn: Conn) -> None:
    try:
        conn[1].close()
    except RuntimeError:  # its event loop is closed already
        pass


class UnixConnector:
    """Connects to the agent listening at ``path``; with a ``pool``, commands may reuse an
    idle connection instead (see :class:`AgentPool`)."""

    def __init__(self, path: str, pool: AgentPool | None = None) -> None:
        self.path = path
        self.pool = pool

    async def __call__(self) -> Conn:
        path = self.path
        if len(path.encode()) < 100:
            return await asyncio.open_unix_connection(path, limit=MAX_FRAME * 2)
        # sun_path holds 108 bytes: reach a socket in a deep state dir through its dir's fd
        dirfd = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            short = f"/proc/self/fd/{dirfd}/{os.path.basename(path)}"
            return await asyncio.open_unix_connection(short, limit=MAX_FRAME * 2)
        finally:
            os.close(dirfd)


def unix_connector(path: str, pool: AgentPool | None = None) -> AgentConnector:
    """A connector to the agent listening on the unix socket at ``path``."""
    return UnixConnector(path, pool)


def _frame(kind: bytes, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind[0], 0, len(payload)) + payload


class AgentProcess:
    """A command started by the agent; events come from :meth:`next_event`."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._return_to: tuple[AgentPool, str] | None = None  # where the connection goes at exit
        self.pid: int | None = None
        self.exit_code: int | None = None
        self.signal: int | None = None

    @classmethod
    async def start(cls, connector: AgentConnector, req: SpawnRequest,
                    no_stdin: bool = False) -> AgentProcess:
        """Start ``req``; with ``no_stdin`` its stdin is closed in the same write (one
        syscall and one wake-up of the agent fewer: it reads frame by frame, so the end
        of stdin waits in the socket until the command runs)."""
        pool: AgentPool | None = getattr(connector, "pool", None)
        reuse = pool is not None and no_stdin and not (req.detach or req.pty or req.keep)
        frames = _frame(b"S", req.encode(reuse=reuse))
        if no_stdin and not req.detach:
            frames += _frame(b"E")
        proc = kind = None
        if reuse and (conn := pool.take(connector.path)) is not None:
            proc = cls(*conn)
            proc._writer.write(frames)
            try:
                kind, payload = await proc._read_frame()
            except AgentGone:
                # The agent closed it while idle (its timeout, a restart), before reading
                # the spawn: nothing ran, so a new connection is safe.
                proc.close()
                proc = None
        if proc is None:
            try:
                reader, writer = await connector()
            except OSError as exc:
                raise AgentGone(f"sandbox agent unreachable: {exc}") from exc
            proc = cls(reader, writer)
            writer.write(frames)
            kind, payload = await proc._read_frame()
        if reuse:
            proc._return_to = (pool, connector.path)
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
            self._release()
            return "exit", b""
        raise AgentGone(f"unexpected agent frame {kind!r}")

    def _release(self) -> None:
        """At the exit frame: the connection goes back to its pool, else it closes. Either
        way this handle writes nothing more to it."""
        if self._return_to is not None and not self._writer.is_closing():
            pool, path = self._return_to
            pool.put(path, (self._reader, self._writer))
            self._writer = _Released()
        else:
            self.close()

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


class _Released:
    """What a handle writes to once its connection went back to the pool: nothing."""

    def is_closing(self) -> bool:
        return True

    def write(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        pass

    async def drain(self) -> None:
        pass


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
