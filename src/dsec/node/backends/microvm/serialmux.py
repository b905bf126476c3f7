"""The node's end of a guest's agent port: many connections over one virtio-serial port.

QEMU exposes the guest's ``dsec.agent`` virtio-serial port as a unix socket (``agent.sock``
in the sandbox directory). A virtio-serial port is a single byte stream, so the node and the
guest's ``dsec-agent serve-serial`` multiplex it; the frames and their rules are described
beside ``serve_serial`` in ``node/agent/agent.c``. Every channel gets a socketpair here: the
caller holds one end as if it were a connection to the agent (asyncio streams or a blocking
socket), and this module moves bytes between the other end and the port, within the
credit the other side granted, so a caller that stops reading stalls only its own channel.

All muxes run on one event loop in a thread of their own: callers on any loop, and worker
threads, share them, and the sandbox directory names each one. A mux whose QEMU ended (a
guest stopped, or saved to disk and restored by a new QEMU) is dropped and made again on
the next connection.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import struct
import threading
from concurrent.futures import Future
from pathlib import Path

from dsec.node.agent.client import HEADER  # the same frame header as the agent protocol

__all__ = ["connect", "connect_sync", "drop", "MAGIC"]

MAGIC = b"DSECMUX1"
WINDOW = 256 * 1024
CHUNK = 64 * 1024
HELLO_EVERY_S = 0.5


class _Channel:
    def __init__(self, mux: _Mux, cid: int, end: socket.socket) -> None:
        self.mux, self.id, self.end = mux, cid, end
        self.credit = WINDOW          # bytes we may still send to the guest
        self.has_credit = asyncio.Event()
        self.has_credit.set()
        self.inbound: asyncio.Queue[bytes | None] = asyncio.Queue()  # None: guest closed
        self.queued = 0               # bytes received and not yet passed to the caller
        self.tasks: list[asyncio.Task] = []
        self.sent_eof = self.got_eof = False

    def start(self) -> None:
        self.tasks = [asyncio.create_task(self._to_guest()), asyncio.create_task(self._to_caller())]

    async def _to_guest(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                await self.has_credit.wait()
                data = await loop.sock_recv(self.end, min(self.credit, CHUNK))
                if not data:
                    break
                self.credit -= len(data)
                if self.credit == 0:
                    self.has_credit.clear()
                self.mux.send(b"d", self.id, data)
        except OSError:
            pass
        self.sent_eof = True
        self.mux.send(b"c", self.id)
        self._maybe_done()

    async def _to_caller(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            data = await self.inbound.get()
            if data is None:
                try:
                    self.end.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                self.got_eof = True
                self._maybe_done()
                return
            try:
                await loop.sock_sendall(self.end, data)
            except OSError:  # the caller closed its end: the guest's handler ends too
                self.mux.send(b"r", self.id)
                self.close()
                return
            self.queued -= len(data)
            self.mux.send(b"a", self.id, struct.pack(">I", len(data)))

    def receive(self, data: bytes) -> None:
        """Bytes from the guest; more than the credit it was given drops the channel (a
        guest must not make the node hold what it never asked for)."""
        self.queued += len(data)
        if self.queued > WINDOW:
            self.mux.send(b"r", self.id)
            self.close()
            return
        self.inbound.put_nowait(data)

    def grant(self, n: int) -> None:
        self.credit += n
        self.has_credit.set()

    def _maybe_done(self) -> None:
        if self.sent_eof and self.got_eof:
            self.close()

    def close(self) -> None:
        if self.mux.channels.pop(self.id, None) is None:
            return
        current = asyncio.current_task()
        for t in self.tasks:
            if t is not current:
                t.cancel()
        self.end.close()


class _Mux:
    """One guest's port: the connection to QEMU's socket and the channels over it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.channels: dict[int, _Channel] = {}
        self.ids = itertools.count(1)
        self.ready = asyncio.Event()
        self.dead = False
        self.writer: asyncio.StreamWriter | None = None
        self.tasks: list[asyncio.Task] = []
        self._connecting: asyncio.Task | None = None

    async def connect(self) -> None:
        if self._connecting is None:
            self._connecting = asyncio.create_task(self._connect())
        await asyncio.shield(self._connecting)

    async def _connect(self) -> None:
        try:
            reader, self.writer = await asyncio.open_unix_connection(str(self.path), limit=1 << 21)
        except OSError:
            self.dead = True
            raise
        self.tasks = [asyncio.create_task(self._read(reader)),
                      asyncio.create_task(self._hello())]

    def send(self, kind: bytes, cid: int, payload: bytes = b"") -> None:
        if self.writer is not None and not self.dead:
            self.writer.write(HEADER.pack(kind[0], cid, len(payload)) + payload)

    async def _hello(self) -> None:
        # Repeated until answered: the guest may still be booting, or skipping a partial
        # frame a previous node left behind.
        while not self.ready.is_set():
            self.send(b"H", 0, MAGIC)
            try:
                await asyncio.wait_for(self.ready.wait(), HELLO_EVERY_S)
            except asyncio.TimeoutError:
                pass

    async def _read(self, reader: asyncio.StreamReader) -> None:
        answer = HEADER.pack(ord("h"), 0, len(MAGIC)) + MAGIC
        try:
            await reader.readuntil(answer)  # skips what an earlier node's session left
            self.ready.set()
            while True:
                kind, cid, length = HEADER.unpack(await reader.readexactly(HEADER.size))
                if length > CHUNK:
                    return  # out of step with the guest: start over with a new mux
                self._frame(kind, cid, await reader.readexactly(length))
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            return
        finally:
            self.close()

    def _frame(self, kind: int, cid: int, payload: bytes) -> None:
        ch = self.channels.get(cid)
        if ch is None:
            return
        if kind == ord("d"):
            ch.receive(payload)
        elif kind == ord("a") and len(payload) == 4:
            ch.grant(struct.unpack(">I", payload)[0])
        elif kind == ord("c"):
            ch.inbound.put_nowait(None)
        elif kind == ord("r"):
            ch.close()

    async def open(self) -> socket.socket:
        await self.connect()
        await self.ready.wait()
        if self.dead:
            raise ConnectionRefusedError(f"guest agent port {self.path} closed")
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        mine.setblocking(False)
        ch = _Channel(self, next(self.ids), mine)
        self.channels[ch.id] = ch
        self.send(b"o", ch.id)
        ch.start()
        return theirs

    def close(self) -> None:
        self.dead = True
        self.ready.set()  # wake waiters: they see dead
        for ch in list(self.channels.values()):
            ch.close()
        for t in self.tasks:
            if t is not asyncio.current_task():
                t.cancel()
        if self.writer is not None:
            self.writer.close()
        if _muxes.get(self.path) is self:
            del _muxes[self.path]


_muxes: dict[Path, _Mux] = {}
_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def _mux_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _loop_lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="dsec-serialmux",
                             daemon=True).start()
        return _loop


async def _open(path: Path) -> socket.socket:
    mux = _muxes.get(path)
    if mux is None or mux.dead:
        mux = _muxes[path] = _Mux(path)
    try:
        return await mux.open()
    except OSError:
        mux.close()
        raise


def _submit(path: Path) -> Future:
    return asyncio.run_coroutine_threadsafe(_open(path), _mux_loop())


async def connect(path: Path, limit: int = 1 << 21):
    """(reader, writer) of a new connection to the agent behind the port at ``path``."""
    fut = _submit(path)
    try:
        sock = await asyncio.wrap_future(fut)
    except asyncio.CancelledError:
        fut.add_done_callback(lambda f: f.cancelled() or f.exception() or f.result().close())
        raise
    return await asyncio.open_connection(sock=sock, limit=limit)


def connect_sync(path: Path, timeout: float = 10.0) -> socket.socket:
    """A blocking socket connected to the agent behind the port at ``path``."""
    fut = _submit(path)
    try:
        sock = fut.result(timeout)
    except TimeoutError as exc:
        fut.cancel()
        raise ConnectionRefusedError(f"guest agent port {path} did not answer") from exc
    sock.settimeout(timeout)
    return sock


def drop(path: Path) -> None:
    """Forget the mux of the port at ``path`` (its QEMU is ending or ended)."""
    loop = _loop
    if loop is not None:
        loop.call_soon_threadsafe(lambda: (m := _muxes.get(path)) and m.close())
