"""The node's side of the guest agent port multiplexer, against a fake guest end speaking
the frames of agent.c's serve_serial (the real guest end runs in test_microvm.py)."""

from __future__ import annotations

import asyncio
import struct

import pytest

from dsec.node.agent.client import HEADER
from dsec.node.backends.microvm import serialmux

pytestmark = pytest.mark.timeout(60)
HELLO_ACK = HEADER.pack(ord("h"), 0, 8) + serialmux.MAGIC


class FakeGuest:
    """A unix socket in QEMU's place: answers hello, records frames, echoes if asked."""

    def __init__(self, path, echo: bool = True, garbage: bytes = b"") -> None:
        self.path, self.echo, self.garbage = path, echo, garbage
        self.frames: list[tuple[str, int, bytes]] = []
        self.writer: asyncio.StreamWriter | None = None

    async def start(self) -> FakeGuest:
        self.server = await asyncio.start_unix_server(self._serve, str(self.path))
        return self

    def send(self, kind: str, cid: int, payload: bytes = b"") -> None:
        self.writer.write(HEADER.pack(ord(kind), cid, len(payload)) + payload)

    async def _serve(self, reader, writer) -> None:
        self.writer = writer
        writer.write(self.garbage)  # what an earlier session left in the port
        try:
            while True:
                kind, cid, n = HEADER.unpack(await reader.readexactly(HEADER.size))
                payload = await reader.readexactly(n)
                self.frames.append((chr(kind), cid, payload))
                if kind == ord("H"):
                    writer.write(HELLO_ACK)
                elif kind == ord("d") and self.echo:
                    self.send("a", cid, struct.pack(">I", n))
                    self.send("d", cid, payload)
                elif kind == ord("c") and self.echo:
                    self.send("c", cid)
        except (asyncio.IncompleteReadError, asyncio.CancelledError):
            pass

    async def close(self) -> None:
        self.server.close()
        if self.writer:
            self.writer.close()


async def _roundtrip(path, data: bytes) -> bytes:
    reader, writer = await serialmux.connect(path)
    writer.write(data)
    writer.write_eof()
    out = await reader.read()
    writer.close()
    return out


async def test_hello_skips_what_an_earlier_session_left(tmp_path):
    path = tmp_path / "agent.sock"
    guest = await FakeGuest(path, garbage=b"\x00d\x00\x00\x00\x07stale-partial").start()
    try:
        assert await asyncio.wait_for(_roundtrip(path, b"ping"), 10) == b"ping"
        kinds = [k for k, _, _ in guest.frames]
        assert kinds[0] == "H" and "o" in kinds
    finally:
        serialmux.drop(path)
        await guest.close()


async def test_channels_are_separate_and_large_data_flows_within_credit(tmp_path):
    path = tmp_path / "agent.sock"
    guest = await FakeGuest(path).start()
    try:
        blobs = [bytes([i]) * (600_000 + i) for i in range(5)]
        outs = await asyncio.wait_for(
            asyncio.gather(*(_roundtrip(path, b) for b in blobs)), 30)
        assert outs == blobs
        sent = {}
        for kind, cid, payload in guest.frames:
            if kind == "d":
                sent[cid] = sent.get(cid, 0) + len(payload)
                assert len(payload) <= serialmux.CHUNK
        assert sorted(sent.values()) == [len(b) for b in blobs]
    finally:
        serialmux.drop(path)
        await guest.close()


async def test_a_guest_that_sends_beyond_its_credit_loses_the_channel(tmp_path):
    path = tmp_path / "agent.sock"
    guest = await FakeGuest(path, echo=False).start()
    try:
        reader, writer = await serialmux.connect(path)
        while not any(k == "o" for k, _, _ in guest.frames):
            await asyncio.sleep(0.01)
        cid = next(c for k, c, _ in guest.frames if k == "o")
        # The caller reads nothing; once its socket buffer is full, the node acks no more,
        # and a guest that goes on sending exceeds the window it was granted.
        sent = 0
        while ("r", cid, b"") not in guest.frames and sent < 64 << 20:
            guest.send("d", cid, b"x" * serialmux.CHUNK)
            sent += serialmux.CHUNK
            await guest.writer.drain()
            await asyncio.sleep(0)
        assert ("r", cid, b"") in guest.frames
        acked = sum(struct.unpack(">I", p)[0] for k, c, p in guest.frames if k == "a" and c == cid)
        assert sent - acked > serialmux.WINDOW  # dropped only once it really overran
        got = await asyncio.wait_for(reader.read(), 10)  # the caller sees what was granted
        assert acked <= len(got) <= acked + serialmux.CHUNK  # (+ a chunk cut off mid-write)
        writer.close()
    finally:
        serialmux.drop(path)
        await guest.close()


async def test_a_port_nobody_serves_is_refused(tmp_path):
    with pytest.raises(OSError):
        await serialmux.connect(tmp_path / "missing.sock")
    with pytest.raises(OSError):
        await asyncio.to_thread(serialmux.connect_sync, tmp_path / "missing.sock", 2.0)
