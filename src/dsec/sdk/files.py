"""The files of a sandbox, as the asynchronous SDK sees them: ``sb.files.read(path)``."""

from __future__ import annotations

import asyncio
import contextlib
import io
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import httpx

from dsec.api.errors import NotFound
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
        resp = await self._client._request("GET", self._base, params={"path": path})
        return resp.content

    async def write(self, path: str, data: bytes | str, mode: int = 0o644) -> FileInfo:
        """Create or replace a file."""
        if isinstance(data, str):
            data = data.encode()
        resp = await self._client._request("PUT", self._base,
                                           params={"path": path, "mode": mode}, content=data)
        return parse(FileInfo, resp)

    async def upload(self, local: str | Path | BinaryIO, path: str,
                     mode: int = 0o644) -> FileInfo:
        """Stream a local file (a path, or a binary file object such as
        ``sys.stdin.buffer``) into the sandbox without reading it into memory."""
        async def chunks() -> AsyncIterator[bytes]:
            if not isinstance(local, (str, Path)):  # a pipe may block: read off the loop
                while chunk := await asyncio.to_thread(local.read, CHUNK):
                    yield chunk
                return
            with open(local, "rb") as f:
                while chunk := f.read(CHUNK):
                    yield chunk
        resp = await self._client._request("PUT", self._base, params={"path": path, "mode": mode},
                                           content=chunks(), timeout=None)
        return parse(FileInfo, resp)

    async def download(self, path: str, local: str | Path | BinaryIO) -> int:
        """Stream a sandbox file to a local file (a path, or a binary file object such as
        ``sys.stdout.buffer``); returns the bytes written."""
        n = 0
        try:
            async with self._client._http.stream("GET", self._base, params={"path": path},
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
        resp = await self._client._request("GET", f"{self._base}/stat", params={"path": path})
        return parse(FileInfo, resp)

    async def list(self, path: str = "/") -> list[FileInfo]:
        resp = await self._client._request("GET", f"{self._base}/list", params={"path": path})
        return parse(FileList, resp).entries

    async def mkdir(self, path: str, parents: bool = True) -> FileInfo:
        resp = await self._client._request("POST", f"{self._base}/mkdir",
                                           params={"path": path, "parents": parents})
        return parse(FileInfo, resp)

    async def remove(self, path: str, recursive: bool = False) -> None:
        await self._client._request("DELETE", self._base,
                                    params={"path": path, "recursive": recursive})

    async def upload_dir(self, local_dir: str | Path, path: str) -> int:
        """Copy a local directory's contents into ``path`` (as a tar); returns entries."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            tf.add(str(local_dir), arcname=".")
        resp = await self._client._request("PUT", f"{self._base}/tar", params={"path": path},
                                           content=buf.getvalue(), timeout=None)
        return parse(TarWritten, resp).entries

    async def download_dir(self, path: str, local_dir: str | Path) -> int:
        """Copy a sandbox directory to ``local_dir``; returns the number of entries."""
        dest = Path(local_dir)
        dest.mkdir(parents=True, exist_ok=True)
        data = await self.download_tar(path)
        with tarfile.open(fileobj=io.BytesIO(data)) as tf:
            members = tf.getmembers()
            tf.extractall(dest, filter="data")
        return len(members)

    async def download_tar(self, path: str) -> bytes:
        """The tar stream of ``path`` as bytes."""
        resp = await self._client._request("GET", f"{self._base}/tar", params={"path": path},
                                           timeout=None)
        return resp.content

    async def upload_tar(self, data: bytes, path: str) -> int:
        """Unpack a tar archive into ``path``; hostile entries are refused by name."""
        resp = await self._client._request("PUT", f"{self._base}/tar", params={"path": path},
                                           content=data, timeout=None)
        return parse(TarWritten, resp).entries
