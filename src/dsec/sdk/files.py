"""The files of a sandbox, as the asynchronous SDK sees them: ``sb.files.read(path)``."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import httpx

from dsec.api.errors import InvalidArgument, NotFound, shorten
from dsec.api.models import FileInfo, FileList, TarWritten
from dsec.sdk.boundary import guarded, parse, raise_for_status, translate

if TYPE_CHECKING:
    from dsec.sdk.client import AsyncClient

__all__ = ["AsyncFiles"]

CHUNK = 1 << 20


@guarded
class AsyncFiles:
    """Files of one sandbox; paths are resolved inside the sandbox's root."""

    def __init__(self, client: AsyncClient, sandbox_id: str) -> None:
        self._client = client
        self._base = f"/v1/sandboxes/{sandbox_id}/files"

    async def read(self, path: str) -> bytes:
        """The whole file (use :meth:`download` for large files)."""
        resp = await self._client._request("GET", self._base, params={"path": _path(path)})
        return resp.content

    async def write(self, path: str, data: bytes | str, mode: int = 0o644) -> FileInfo:
        """Create or replace a file."""
        if isinstance(data, str):
            data = data.encode()
        params = {"path": _path(path), "mode": mode}
        resp = await self._client._request("PUT", self._base, params=params,
                                           content=_bytes(data, "write"))
        return parse(FileInfo, resp)

    async def upload(self, local: str | Path | BinaryIO, path: str,
                     mode: int = 0o644) -> FileInfo:
        """Stream a local file (a path, or a binary file object such as
        ``sys.stdin.buffer``) into the sandbox without reading it into memory."""
        if not isinstance(local, (str, Path)):
            _readable(local, "upload", "local")

        async def chunks() -> AsyncIterator[bytes]:
            if not isinstance(local, (str, Path)):
                async for chunk in _read(local):
                    yield chunk
                return
            with open(local, "rb") as f:
                while chunk := f.read(CHUNK):
                    yield chunk
        params = {"path": _path(path), "mode": mode}
        resp = await self._client._request("PUT", self._base, params=params,
                                           content=chunks(), timeout=None)
        return parse(FileInfo, resp)

    async def download(self, path: str, local: str | Path | BinaryIO) -> int:
        """Stream a sandbox file to a local file (a path, or a binary file object such as
        ``sys.stdout.buffer``); returns the bytes written."""
        n = 0
        if not isinstance(local, (str, Path)) and not callable(getattr(local, "write", None)):
            raise InvalidArgument(f"download's local must be a local path or a binary file "
                                  f"object; got {type(local).__name__}")
        try:
            async with self._client._http.stream("GET", self._base, params={"path": _path(path)},
                                                 timeout=None) as resp:
                await raise_for_status(resp)
                with contextlib.ExitStack() as stack:
                    f = local if not isinstance(local, (str, Path)) \
                        else stack.enter_context(open(local, "wb"))
                    async for chunk in resp.aiter_bytes(CHUNK):
                        f.write(chunk)
                        n += len(chunk)
                    f.flush()
        except httpx.HTTPError as exc:
            raise translate(exc, f"download {path}", self._client.url) from exc
        return n

    async def exists(self, path: str) -> bool:
        """Whether ``path`` exists in the sandbox (E2B's ``files.exists``)."""
        try:
            await self.stat(path)
        except NotFound:
            return False
        return True

    async def stat(self, path: str) -> FileInfo:
        resp = await self._client._request("GET", f"{self._base}/stat",
                                           params={"path": _path(path)})
        return parse(FileInfo, resp)

    async def list(self, path: str = "/") -> list[FileInfo]:
        resp = await self._client._request("GET", f"{self._base}/list",
                                           params={"path": _path(path)})
        return parse(FileList, resp).entries

    async def mkdir(self, path: str, parents: bool = True) -> FileInfo:
        resp = await self._client._request("POST", f"{self._base}/mkdir",
                                           params={"path": _path(path), "parents": parents})
        return parse(FileInfo, resp)

    async def remove(self, path: str, recursive: bool = False) -> None:
        await self._client._request("DELETE", self._base,
                                    params={"path": _path(path), "recursive": recursive})

    async def upload_dir(self, local_dir: str | Path, path: str) -> int:
        """Copy a local directory's contents into ``path`` (as a tar); returns entries."""
        path = _path(path)
        if not isinstance(local_dir, (str, Path)):
            raise InvalidArgument(f"upload_dir's local_dir must be a local path; got "
                                  f"{type(local_dir).__name__}")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            tf.add(str(local_dir), arcname=".")
        resp = await self._client._request("PUT", f"{self._base}/tar", params={"path": path},
                                           content=buf.getvalue(), timeout=None)
        return parse(TarWritten, resp).entries

    async def download_dir(self, path: str, local_dir: str | Path) -> int:
        """Copy a sandbox directory to ``local_dir``; returns the number of entries."""
        path = _path(path)
        if not isinstance(local_dir, (str, Path)):
            raise InvalidArgument(f"download_dir's local_dir must be a local path; got "
                                  f"{type(local_dir).__name__}")
        dest = Path(local_dir)
        dest.mkdir(parents=True, exist_ok=True)
        data = await self.download_tar(path)
        with tarfile.open(fileobj=io.BytesIO(data)) as tf:
            members = tf.getmembers()
            tf.extractall(dest, filter="data")
        return len(members)

    async def download_tar(self, path: str) -> bytes:
        """The tar stream of ``path`` as bytes."""
        resp = await self._client._request("GET", f"{self._base}/tar",
                                           params={"path": _path(path)}, timeout=None)
        return resp.content

    async def upload_tar(self, data: bytes | BinaryIO, path: str) -> int:
        """Unpack a tar archive (bytes, or a binary file object read as it is sent) into
        ``path``; hostile entries are refused by name."""
        params = {"path": _path(path)}
        content = _read(data) if _readable(data) else _bytes(data, "upload_tar")
        resp = await self._client._request("PUT", f"{self._base}/tar", params=params,
                                           content=content, timeout=None)
        return parse(TarWritten, resp).entries


def _path(path: object) -> str:
    """``path`` checked before it is sent: a path in the sandbox is a str (or a path object).
    With arguments swapped, a tar's bytes once went as the path and came back whole in the
    server's "File name too long"."""
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str):
        raise InvalidArgument(f"a sandbox path must be a str; got {type(path).__name__} "
                              f"{shorten(repr(path), 60)} (were the arguments swapped?)")
    return path


def _bytes(data: object, method: str) -> bytes:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidArgument(f"{method}'s data must be bytes; got {type(data).__name__} "
                              f"{shorten(repr(data), 60)} (were the arguments swapped?)")
    return bytes(data)  # httpx sends only bytes whole; a bytearray it would iterate


def _readable(f: object, method: str | None = None, arg: str = "") -> bool:
    """Whether ``f`` is a file object to read from; with ``method``, refuse one that is not."""
    ok = callable(getattr(f, "read", None)) and not isinstance(f, (str, bytes))
    if not ok and method:
        raise InvalidArgument(f"{method}'s {arg} must be a local path or a binary file object; "
                              f"got {type(f).__name__}")
    return ok


async def _read(f: BinaryIO) -> AsyncIterator[bytes]:
    """A file object's bytes in chunks, read off the loop (a pipe may block)."""
    while chunk := await asyncio.to_thread(f.read, CHUNK):
        yield chunk
