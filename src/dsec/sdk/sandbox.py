"""A sandbox handle and its shells and files, as the asynchronous SDK sees them."""

from __future__ import annotations

import base64
import io
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

from dsec.api.errors import error_from_wire
from dsec.api.models import (MAX_OUTPUT_DEFAULT, ExecEvent, ExecRequest, ExecResult, FileInfo,
                             FileList, ImageSummary, InputRequest, PackDiffRequest, SandboxInfo,
                             ShellInfo, ShellRunRequest, validated)
from dsec.api.rl import AuditList, AuditRecord, NetworkRequest, NetworkStatus, TrajectoryPage

if TYPE_CHECKING:
    from dsec.sdk.client import AsyncClient

__all__ = ["AsyncSandbox", "AsyncShell", "AsyncFiles", "AsyncInput"]

CHUNK = 1 << 20


def _exec_body(cmd: str | list[str], cwd: str | None, env: dict[str, str] | None,
               user: str | None, stdin: bytes | str | None, timeout: float | None,
               max_output: int, background: bool, step: str | None) -> dict:
    if isinstance(stdin, str):
        stdin = stdin.encode()
    return validated(ExecRequest, cmd=cmd, cwd=cwd, env=env or {}, user=user,
                       stdin=base64.b64encode(stdin).decode() if stdin else None,
                       timeout=timeout, max_output=max_output, background=background,
                       step=step).model_dump()


class AsyncSandbox:
    """One sandbox. Obtain it from ``client.create(...)`` or ``client.get(id)``."""

    def __init__(self, client: AsyncClient, info: SandboxInfo) -> None:
        self._client = client
        self.info = info
        self.id = info.id
        self.files = AsyncFiles(client, info.id)
        self.input = AsyncInput(client, info.id)

    def __repr__(self) -> str:
        return f"<Sandbox {self.id} {self.info.backend} {self.info.image} {self.info.state}>"

    async def refresh(self) -> SandboxInfo:
        """Fetch the current state from the server."""
        resp = await self._client._request("GET", f"/v1/sandboxes/{self.id}")
        self.info = SandboxInfo.model_validate(resp.json())
        return self.info

    async def exec(self, cmd: str | list[str], *, cwd: str | None = None,
                   env: dict[str, str] | None = None, user: str | None = None,
                   stdin: bytes | str | None = None, timeout: float | None = 60.0,
                   max_output: int = MAX_OUTPUT_DEFAULT, background: bool = False,
                   step: str | None = None) -> ExecResult:
        """Run a command to completion. A string runs under ``/bin/sh -c``; a list as argv.

        A non-zero exit is a result, not an error; a timeout kills the process group and
        returns ``timed_out=True`` with the output so far."""
        body = _exec_body(cmd, cwd, env, user, stdin, timeout, max_output, background, step)
        http_timeout = None if timeout is None else timeout + 30
        resp = await self._client._request("POST", f"/v1/sandboxes/{self.id}/exec", json=body,
                                           timeout=http_timeout)
        return ExecResult.model_validate_json(resp.content)

    async def exec_stream(self, cmd: str | list[str], *, cwd: str | None = None,
                          env: dict[str, str] | None = None, user: str | None = None,
                          stdin: bytes | str | None = None, timeout: float | None = 600.0,
                          max_output: int = MAX_OUTPUT_DEFAULT,
                          step: str | None = None) -> AsyncIterator[ExecEvent]:
        """Yield stdout/stderr chunks as they are written, then one ``exit`` event."""
        body = _exec_body(cmd, cwd, env, user, stdin, timeout, max_output, False, step)
        async for line in self._client._stream_lines(f"/v1/sandboxes/{self.id}/exec/stream",
                                                      body):
            if "error" in line:
                raise error_from_wire(line, 500)
            yield ExecEvent.model_validate(line)

    async def shell(self) -> AsyncShell:
        """A shell session: cwd and exported variables persist between ``run`` calls."""
        resp = await self._client._request("POST", f"/v1/sandboxes/{self.id}/shells")
        return AsyncShell(self._client, ShellInfo.model_validate(resp.json()))

    async def screenshot(self) -> bytes:
        """The sandbox's display as PNG bytes (``backend="vm"``; others raise Unsupported)."""
        resp = await self._client._request("GET", f"/v1/sandboxes/{self.id}/screenshot")
        return resp.content

    async def pause(self) -> SandboxInfo:
        """Freeze every process; files and memory stay. Any later request resumes it."""
        resp = await self._client._request("POST", f"/v1/sandboxes/{self.id}/pause")
        self.info = SandboxInfo.model_validate(resp.json())
        return self.info

    async def resume(self) -> SandboxInfo:
        """Thaw a paused sandbox."""
        resp = await self._client._request("POST", f"/v1/sandboxes/{self.id}/resume")
        self.info = SandboxInfo.model_validate(resp.json())
        return self.info

    async def pack_diff(self, tag: str, exclude: list[str] | None = None) -> ImageSummary:
        """Turn the writable layer into a new layer over the image, tagged ``tag``."""
        body = validated(PackDiffRequest, tag=tag, exclude=exclude or []).model_dump()
        resp = await self._client._request("POST", f"/v1/sandboxes/{self.id}/pack_diff",
                                           json=body, timeout=None)
        return ImageSummary.model_validate(resp.json())

    async def set_network(self, allow: dict[str, bool]) -> NetworkStatus:
        """Change egress permissions while the sandbox runs (names from the node's config)."""
        body = NetworkRequest(allow=allow).model_dump()
        resp = await self._client._request("PUT", f"/v1/sandboxes/{self.id}/network", json=body)
        return NetworkStatus.model_validate(resp.json())

    async def network(self) -> NetworkStatus:
        """Current permissions, and the packets and destinations refused so far."""
        resp = await self._client._request("GET", f"/v1/sandboxes/{self.id}/network")
        return NetworkStatus.model_validate(resp.json())

    async def trajectory(self, offset: int = 0, limit: int = 1000) -> TrajectoryPage:
        """The sandbox's log of mutating calls and their results, from ``offset``."""
        resp = await self._client._request("GET", f"/v1/sandboxes/{self.id}/trajectory",
                                           params={"offset": offset, "limit": limit})
        return TrajectoryPage.model_validate(resp.json())

    async def audit(self) -> list[AuditRecord]:
        """Actions this sandbox was refused: network destinations, divergent replays."""
        resp = await self._client._request("GET", f"/v1/sandboxes/{self.id}/audit")
        return AuditList.model_validate(resp.json()).records

    async def stop(self) -> None:
        """Stop the sandbox and remove everything it had."""
        await self._client._request("DELETE", f"/v1/sandboxes/{self.id}")


class AsyncShell:
    """A persistent shell in a sandbox, from ``await sandbox.shell()``."""

    def __init__(self, client: AsyncClient, info: ShellInfo) -> None:
        self._client = client
        self.id = info.id
        self.sandbox_id = info.sandbox_id

    async def run(self, cmd: str, *, timeout: float | None = 60.0,
                  max_output: int = MAX_OUTPUT_DEFAULT, step: str | None = None) -> ExecResult:
        """Run ``cmd`` in the session; on timeout the command is killed, the shell lives."""
        body = validated(ShellRunRequest, cmd=cmd, timeout=timeout, max_output=max_output,
                               step=step).model_dump()
        resp = await self._client._request(
            "POST", f"/v1/sandboxes/{self.sandbox_id}/shells/{self.id}/run", json=body,
            timeout=None if timeout is None else timeout + 30)
        return ExecResult.model_validate(resp.json())

    async def close(self) -> None:
        """End the shell process."""
        await self._client._request("DELETE", f"/v1/sandboxes/{self.sandbox_id}/shells/{self.id}")


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
        return FileInfo.model_validate(resp.json())

    async def upload(self, local: str | Path, path: str, mode: int = 0o644) -> FileInfo:
        """Stream a local file into the sandbox without reading it into memory."""
        async def chunks() -> AsyncIterator[bytes]:
            with open(local, "rb") as f:
                while chunk := f.read(CHUNK):
                    yield chunk
        resp = await self._client._request("PUT", self._base, params={"path": path, "mode": mode},
                                           content=chunks(), timeout=None)
        return FileInfo.model_validate(resp.json())

    async def download(self, path: str, local: str | Path) -> int:
        """Stream a sandbox file to a local file; returns the bytes written."""
        n = 0
        async with self._client._http.stream("GET", self._base, params={"path": path},
                                             timeout=None) as resp:
            if resp.status_code >= 400:
                await resp.aread()
                raise error_from_wire(resp.json(), resp.status_code)
            with open(local, "wb") as f:
                async for chunk in resp.aiter_bytes(CHUNK):
                    f.write(chunk)
                    n += len(chunk)
        return n

    async def stat(self, path: str) -> FileInfo:
        resp = await self._client._request("GET", f"{self._base}/stat", params={"path": path})
        return FileInfo.model_validate(resp.json())

    async def list(self, path: str = "/") -> list[FileInfo]:
        resp = await self._client._request("GET", f"{self._base}/list", params={"path": path})
        return FileList.model_validate(resp.json()).entries

    async def mkdir(self, path: str, parents: bool = True) -> FileInfo:
        resp = await self._client._request("POST", f"{self._base}/mkdir",
                                           params={"path": path, "parents": parents})
        return FileInfo.model_validate(resp.json())

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
        return int(resp.json()["entries"])

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
        return int(resp.json()["entries"])




class AsyncInput:
    """Keyboard and mouse of a sandbox with a display (``backend="vm"``)."""

    def __init__(self, client: AsyncClient, sandbox_id: str) -> None:
        self._client = client
        self._path = f"/v1/sandboxes/{sandbox_id}/input"

    async def type(self, text: str) -> None:
        """Type ``text`` (US layout; ``\\n`` is Enter)."""
        await self._client._request("POST", self._path,
                                    json=validated(InputRequest, text=text).model_dump())

    async def keys(self, *keys: str) -> None:
        """Press a chord of keys together, e.g. ``keys("ctrl", "c")``."""
        await self._client._request("POST", self._path,
                                    json=validated(InputRequest, keys=list(keys)).model_dump())

    async def click(self, x: int, y: int, button: str = "left") -> None:
        """Click at screen pixel (x, y)."""
        body = validated(InputRequest, click=(x, y), button=button).model_dump()
        await self._client._request("POST", self._path, json=body)
