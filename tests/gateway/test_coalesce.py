"""A response's writes leave in one send, and nothing is held back past the loop turn.

The transport's unit tests use a recording stand-in for the socket transport (what is
asserted is which writes reach it, and when); the server tests run real uvicorn with
:class:`CoalescingProtocol` on a loopback port.
"""

from __future__ import annotations

import asyncio
import socket

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from dsec.gateway.coalesce import FLUSH_AT, CoalescingProtocol, CoalescingTransport


class _Recorder:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = self.aborted = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name, default=None):
        return f"extra:{name}"


async def test_writes_of_one_turn_leave_as_one():
    rec = _Recorder()
    t = CoalescingTransport(rec, asyncio.get_running_loop())
    t.write(b"HTTP/1.1 200 OK\r\n\r\n")
    t.write(b"body")
    assert rec.writes == [] and t.get_write_buffer_size() == 23
    await asyncio.sleep(0)
    assert rec.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody"]
    t.write(b"next")
    await asyncio.sleep(0)
    assert rec.writes[-1] == b"next" and len(rec.writes) == 2


async def test_a_large_write_and_a_close_go_out_at_once():
    rec = _Recorder()
    t = CoalescingTransport(rec, asyncio.get_running_loop())
    t.write(b"x" * FLUSH_AT)
    assert rec.writes == [b"x" * FLUSH_AT]
    t.write(b"last")
    t.close()
    assert rec.writes[-1] == b"last" and rec.closed
    assert t.get_extra_info("peername") == "extra:peername"  # the rest is the transport's


async def test_abort_drops_what_waits():
    rec = _Recorder()
    t = CoalescingTransport(rec, asyncio.get_running_loop())
    t.write(b"never")
    t.abort()
    await asyncio.sleep(0)
    assert rec.writes == [] and rec.aborted


async def _serve(app):
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, http=CoalescingProtocol, log_level="warning",
                                           access_log=False, lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    for _ in range(500):
        if server.started:
            break
        await asyncio.sleep(0.01)
    return server, task, f"http://127.0.0.1:{sock.getsockname()[1]}"


async def test_a_real_server_answers_whole_and_streams_each_chunk_in_its_turn():
    """A streamed chunk goes out before the next is made: the server's second chunk
    waits for the client to have read the first (held back, this would never end)."""
    seen_first = asyncio.Event()

    async def plain(request):
        return JSONResponse({"ok": True, "pad": "y" * 200})

    async def stream(request):
        async def chunks():
            yield b"first\n"
            await asyncio.wait_for(seen_first.wait(), 20)
            yield b"second\n"
        return StreamingResponse(chunks(), media_type="text/plain")

    server, task, url = await _serve(Starlette(routes=[Route("/plain", plain),
                                                       Route("/stream", stream)]))
    try:
        async with httpx.AsyncClient(base_url=url) as c:
            for _ in range(3):  # kept alive: one connection, several answers
                r = await c.get("/plain")
                assert r.status_code == 200 and r.json()["ok"] is True
            async with c.stream("GET", "/stream") as r:
                got = []
                async for line in r.aiter_lines():
                    got.append(line)
                    seen_first.set()
            assert got == ["first", "second"]
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 20)
