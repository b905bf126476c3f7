"""File routes: raw bytes in and out, streamed; tar for directories."""

from __future__ import annotations

import asyncio
import io
import os
import posixpath
from collections.abc import AsyncIterator, Iterator

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from dsec.api.models import FileInfo, FileList
from dsec.gateway.routes.common import node_of
from dsec.trajectory.recorder import FileWriteTap

__all__ = ["router", "MAX_TAR_BYTES"]

router = APIRouter(prefix="/v1/sandboxes/{sb_id}/files")
CHUNK = 1 << 20
MAX_TAR_BYTES = 8 << 30


async def _ops(request: Request, sb_id: str):
    return await node_of(request, sb_id).files(sb_id)


async def _iterate(gen: Iterator[bytes]) -> AsyncIterator[bytes]:
    """Pull a blocking generator in a worker thread, a chunk at a time."""
    sentinel = object()
    while True:
        chunk = await asyncio.to_thread(next, gen, sentinel)
        if chunk is sentinel:
            return
        yield chunk


def _read_chunks(f) -> Iterator[bytes]:
    with f:
        while chunk := f.read(CHUNK):
            yield chunk


@router.get("", response_class=StreamingResponse)
async def read(request: Request, sb_id: str, path: str = Query(...)) -> StreamingResponse:
    ops = await _ops(request, sb_id)
    f = await asyncio.to_thread(ops.open_read, path)
    headers = {}
    try:  # a host file (containers) knows its size; a guest's stream (microvm, vm) does not
        headers["content-length"] = str(os.fstat(f.fileno()).st_size)
    except (AttributeError, OSError, io.UnsupportedOperation):
        pass
    return StreamingResponse(_iterate(_read_chunks(f)), media_type="application/octet-stream",
                             headers=headers)


@router.put("", response_model=FileInfo)
async def write(request: Request, sb_id: str, path: str = Query(...),
                mode: int = Query(0o644, ge=0, le=0o7777)) -> FileInfo:
    ops = await _ops(request, sb_id)
    parent = posixpath.dirname(posixpath.normpath("/" + path))
    if parent != "/":  # like `install -D`: missing parent directories are created
        await asyncio.to_thread(ops.mkdir, parent, True)
    f = await asyncio.to_thread(ops.open_write, path, mode & 0o777)
    tap = FileWriteTap(path, mode & 0o777)
    try:
        async for chunk in request.stream():
            if chunk:
                await asyncio.to_thread(f.write, tap.feed(chunk))
    finally:
        await asyncio.to_thread(f.close)
    info = await asyncio.to_thread(ops.stat, path)
    node_of(request, sb_id).trajectory.record_write(sb_id, tap, info)
    return info


@router.get("/stat", response_model=FileInfo)
async def stat(request: Request, sb_id: str, path: str = Query(...)) -> FileInfo:
    ops = await _ops(request, sb_id)
    return await asyncio.to_thread(ops.stat, path)


@router.get("/list", response_model=FileList)
async def list_dir(request: Request, sb_id: str, path: str = Query("/")) -> FileList:
    ops = await _ops(request, sb_id)
    return FileList(entries=await asyncio.to_thread(ops.list, path))


@router.post("/mkdir", response_model=FileInfo)
async def mkdir(request: Request, sb_id: str, path: str = Query(...),
                parents: bool = True) -> FileInfo:
    ops = await _ops(request, sb_id)
    await asyncio.to_thread(ops.mkdir, path, parents)
    return await asyncio.to_thread(ops.stat, path)


@router.delete("", status_code=204)
async def remove(request: Request, sb_id: str, path: str = Query(...),
                 recursive: bool = False) -> None:
    ops = await _ops(request, sb_id)
    await asyncio.to_thread(ops.remove, path, recursive)


@router.get("/tar", response_class=StreamingResponse)
async def download_tar(request: Request, sb_id: str, path: str = Query(...)):
    ops = await _ops(request, sb_id)
    gen = await asyncio.to_thread(ops.tar_out, path)
    return StreamingResponse(_iterate(gen), media_type="application/x-tar")


class _QueueReader:
    """A blocking file-like reader fed by the event loop (request body -> tarfile)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, body: AsyncIterator[bytes]) -> None:
        self.loop, self.body, self.buf = loop, body, bytearray()
        self.done = False

    def read(self, n: int = -1) -> bytes:
        # tarfile reads a few KiB at a time: one bytearray, consumed from the front (which
        # CPython does in place), holds at most a chunk ahead of the reader
        while not self.done and (n < 0 or len(self.buf) < n):
            fut = asyncio.run_coroutine_threadsafe(self._next(), self.loop)
            chunk = fut.result()
            if chunk is None:
                self.done = True
            else:
                self.buf += chunk
        n = len(self.buf) if n < 0 else min(n, len(self.buf))
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    async def _next(self) -> bytes | None:
        try:
            return await self.body.__anext__()
        except StopAsyncIteration:
            return None


@router.put("/tar")
async def upload_tar(request: Request, sb_id: str, path: str = Query(...)) -> dict:
    ops = await _ops(request, sb_id)
    reader = _QueueReader(asyncio.get_running_loop(), request.stream().__aiter__())
    count = await asyncio.to_thread(ops.tar_in, path, reader, MAX_TAR_BYTES)
    return {"entries": count}
