"""An ASGI app (a gateway, or a node's own API) served by uvicorn on a loopback port in
this test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import socket

__all__ = ["serving"]


@contextlib.asynccontextmanager
async def serving(app):
    """Yield the URL ``app`` answers on; its lifespan runs, and ends with the block."""
    import uvicorn
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on",
                                           ws="websockets-sansio"))
    server.capture_signals = contextlib.nullcontext  # pytest keeps its own handlers
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()  # it failed to start: say why
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task
