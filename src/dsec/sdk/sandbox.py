"""A sandbox handle, its shells and its display, as the asynchronous SDK sees them."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from dsec.api.errors import Internal, error_from_wire
from dsec.api.models import (MAX_OUTPUT_DEFAULT, ExecEvent, ExecRequest, ExecResult,
                             ImageSummary, InputRequest, PackDiffRequest, SandboxInfo, ShellInfo,
                             ShellRunRequest, validated)
from dsec.api.process import ProcessInfo, ProcessList, ProcessRequest, TimeoutRequest
from dsec.api.rl import (AuditRecord, NetworkRequest, NetworkStatus, SandboxAuditList,
                         TrajectoryPage)
from dsec.sdk.boundary import guarded, parse, parse_obj
from dsec.sdk.files import AsyncFiles
from dsec.sdk.process import AsyncProcess, OutputCallback, deliver
from dsec.sdk.pty import AsyncPty, open_pty

if TYPE_CHECKING:
    from dsec.sdk.client import AsyncClient

__all__ = ["AsyncSandbox", "AsyncShell", "AsyncFiles", "AsyncInput"]


def _exec_body(cmd: str | list[str], cwd: str | None, env: dict[str, str] | None,
               user: str | None, stdin: bytes | str | None, timeout: float | None,
               max_output: int, background: bool, step: str | None,
               grading: bool = False) -> dict:
    if isinstance(stdin, str):
        stdin = stdin.encode()
    body = validated(ExecRequest, cmd=cmd, cwd=cwd, env=env or {}, user=user,
                     stdin=base64.b64encode(stdin).decode() if stdin else None,
                     timeout=timeout, max_output=max_output, background=background,
                     step=step, grading=grading).model_dump()
    if not grading:  # only when set: an older server knows no such field
        body.pop("grading")
    return body


@guarded
class AsyncSandbox:
    """One sandbox. Obtain it from ``client.create(...)`` or ``client.get(id)``."""

    id: str
    info: SandboxInfo
    files: AsyncFiles
    input: AsyncInput

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
        self.info = parse(SandboxInfo, resp)
        return self.info

    async def exec(self, cmd: str | list[str], *, cwd: str | None = None,
                   env: dict[str, str] | None = None, user: str | None = None,
                   stdin: bytes | str | None = None, timeout: float | None = 60.0,
                   max_output: int = MAX_OUTPUT_DEFAULT, background: bool = False,
                   step: str | None = None, grading: bool = False,
                   on_stdout: OutputCallback | None = None,
                   on_stderr: OutputCallback | None = None) -> ExecResult:
        """Run a command to completion. A string runs under ``/bin/sh -c``; a list as argv.

        A non-zero exit is a result, not an error; a timeout kills the process group and
        returns ``timed_out=True`` with the output so far. ``grading=True`` runs it as the
        grading step, which reads and writes the sandbox's protected paths.
        ``on_stdout``/``on_stderr`` get each chunk of output as it is written (plain or
        async functions); the result still carries it all. (``background=True`` starts
        it detached, its output discarded; :meth:`spawn` keeps the output and gives a
        handle.)"""
        if on_stdout is not None or on_stderr is not None:
            return await self._exec_streamed(
                cmd, dict(cwd=cwd, env=env, user=user, stdin=stdin, timeout=timeout,
                          max_output=max_output, step=step, grading=grading),
                on_stdout, on_stderr)
        body = _exec_body(cmd, cwd, env, user, stdin, timeout, max_output, background, step,
                          grading)
        http_timeout = None if timeout is None else timeout + 30
        resp = await self._client._request("POST", f"/v1/sandboxes/{self.id}/exec", json=body,
                                           timeout=http_timeout)
        return parse(ExecResult, resp)

    async def _exec_streamed(self, cmd: str | list[str], kw: dict,
                             on_stdout: OutputCallback | None,
                             on_stderr: OutputCallback | None) -> ExecResult:
        out: dict[str, list[str]] = {"stdout": [], "stderr": []}
        result = None
        async for ev in self.exec_stream(cmd, **kw):
            if ev.type == "exit":
                result = ev.result
                continue
            out[ev.type].append(ev.data)
            await deliver(ev, on_stdout, on_stderr)
        if result is None:
            raise Internal(f"the exec stream of {self.id} ended without an exit status")
        return result.model_copy(update={"stdout": "".join(out["stdout"]),
                                         "stderr": "".join(out["stderr"])})

    async def exec_stream(self, cmd: str | list[str], *, cwd: str | None = None,
                          env: dict[str, str] | None = None, user: str | None = None,
                          stdin: bytes | str | None = None, timeout: float | None = 600.0,
                          max_output: int = MAX_OUTPUT_DEFAULT,
                          step: str | None = None, grading: bool = False,
                          on_stdout: OutputCallback | None = None,
                          on_stderr: OutputCallback | None = None
                          ) -> AsyncIterator[ExecEvent]:
        """Yield stdout/stderr chunks as they are written, then one ``exit`` event;
        ``on_stdout``/``on_stderr`` are called with each chunk too."""
        body = _exec_body(cmd, cwd, env, user, stdin, timeout, max_output, False, step,
                          grading)
        async for line in self._client._stream_lines(f"/v1/sandboxes/{self.id}/exec/stream",
                                                      body):
            if "error" in line:
                raise error_from_wire(line, 500)
            ev = parse_obj(ExecEvent, line, "exec_stream")
            await deliver(ev, on_stdout, on_stderr)
            yield ev

    async def spawn(self, cmd: str | list[str], *, cwd: str | None = None,
                    env: dict[str, str] | None = None, user: str | None = None,
                    stdin: bytes | str | None = None, stdin_open: bool = False,
                    timeout: float | None = None, max_output: int = MAX_OUTPUT_DEFAULT,
                    on_stdout: OutputCallback | None = None,
                    on_stderr: OutputCallback | None = None) -> AsyncProcess:
        """Start a command in the background and return its handle at once: ``wait()``,
        ``kill()``, ``send_stdin()`` (with ``stdin_open=True``), ``stream()``, and the
        output kept on the node (``refresh()``). ``on_stdout``/``on_stderr`` get each
        chunk as it is written. ``timeout`` (none by default) kills it when it runs past."""
        body = _exec_body(cmd, cwd, env, user, stdin, timeout, max_output, False, None)
        body.pop("background")
        body.pop("step")
        req = validated(ProcessRequest, **body, stdin_open=stdin_open)
        resp = await self._client._request("POST", f"/v1/sandboxes/{self.id}/processes",
                                           json=req.model_dump(exclude_unset=True))
        proc = AsyncProcess(self._client, self.id, parse(ProcessInfo, resp))
        if on_stdout is not None or on_stderr is not None:
            proc._follow(on_stdout, on_stderr)
        return proc

    async def process(self, pid: int, on_stdout: OutputCallback | None = None,
                      on_stderr: OutputCallback | None = None) -> AsyncProcess:
        """The handle of a background process by its pid (reconnect from any client, e.g.
        after a restart); callbacks get its output from the start, then as it comes."""
        resp = await self._client._request("GET", f"/v1/sandboxes/{self.id}/processes/{pid}")
        proc = AsyncProcess(self._client, self.id, parse(ProcessInfo, resp))
        if on_stdout is not None or on_stderr is not None:
            proc._follow(on_stdout, on_stderr)
        return proc

    async def processes(self) -> list[ProcessInfo]:
        """Background processes, running and recently ended (without their output)."""
        resp = await self._client._request("GET", f"/v1/sandboxes/{self.id}/processes")
        return parse(ProcessList, resp).processes

    async def pty(self, rows: int = 24, cols: int = 80) -> AsyncPty:
        """An interactive shell on a pseudo-terminal (what ``dsec shell`` opens):
        ``write()``, ``read()``, ``resize()``, ``wait()``."""
        ws = await open_pty(self._client.url, self._client._token, self.id, rows, cols)
        return AsyncPty(ws, self.id)

    async def set_timeout(self, timeout_s: float) -> SandboxInfo:
        """The sandbox now stops ``timeout_s`` seconds from now (later or sooner than
        its ``ttl_s`` said). A sandbox that ran out answers ``SandboxStopped`` saying it
        expired."""
        body = validated(TimeoutRequest, timeout_s=timeout_s).model_dump()
        resp = await self._client._request("POST", f"/v1/sandboxes/{self.id}/timeout",
                                           json=body)
        self.info = parse(SandboxInfo, resp)
        return self.info

    async def shell(self) -> AsyncShell:
        """A shell session: cwd and exported variables persist between ``run`` calls."""
        resp = await self._client._request("POST", f"/v1/sandboxes/{self.id}/shells")
        return AsyncShell(self._client, parse(ShellInfo, resp))

    async def screenshot(self) -> bytes:
        """The sandbox's display as PNG bytes (``backend="vm"``; others raise Unsupported)."""
        resp = await self._client._request("GET", f"/v1/sandboxes/{self.id}/screenshot")
        return resp.content

    async def pause(self) -> SandboxInfo:
        """Freeze every process; files and memory stay. Any later request resumes it."""
        resp = await self._client._request("POST", f"/v1/sandboxes/{self.id}/pause")
        self.info = parse(SandboxInfo, resp)
        return self.info

    async def resume(self) -> SandboxInfo:
        """Thaw a paused sandbox."""
        resp = await self._client._request("POST", f"/v1/sandboxes/{self.id}/resume")
        self.info = parse(SandboxInfo, resp)
        return self.info

    async def pack_diff(self, tag: str, exclude: list[str] | None = None) -> ImageSummary:
        """Turn the writable layer into a new layer over the image, tagged ``tag``."""
        body = validated(PackDiffRequest, tag=tag, exclude=exclude or []).model_dump()
        resp = await self._client._request("POST", f"/v1/sandboxes/{self.id}/pack_diff",
                                           json=body, timeout=None)
        return parse(ImageSummary, resp)

    async def set_network(self, allow: dict[str, bool]) -> NetworkStatus:
        """Change egress permissions while the sandbox runs (names from the node's config)."""
        body = validated(NetworkRequest, allow=allow).model_dump()
        resp = await self._client._request("PUT", f"/v1/sandboxes/{self.id}/network", json=body)
        return parse(NetworkStatus, resp)

    async def network(self) -> NetworkStatus:
        """Current permissions, and the packets and destinations refused so far."""
        resp = await self._client._request("GET", f"/v1/sandboxes/{self.id}/network")
        return parse(NetworkStatus, resp)

    async def trajectory(self, offset: int = 0, limit: int = 1000) -> TrajectoryPage:
        """The sandbox's log of mutating calls and their results, from ``offset``."""
        resp = await self._client._request("GET", f"/v1/sandboxes/{self.id}/trajectory",
                                           params={"offset": offset, "limit": limit})
        return parse(TrajectoryPage, resp)

    async def audit(self) -> list[AuditRecord]:
        """Actions this sandbox was refused: network destinations, divergent replays."""
        resp = await self._client._request("GET", f"/v1/sandboxes/{self.id}/audit")
        return parse(SandboxAuditList, resp).records

    async def stop(self) -> None:
        """Stop the sandbox and remove everything it had."""
        await self._client._request("DELETE", f"/v1/sandboxes/{self.id}")


@guarded
class AsyncShell:
    """A persistent shell in a sandbox, from ``await sandbox.shell()``."""

    id: str
    sandbox_id: str

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
        return parse(ExecResult, resp)

    async def close(self) -> None:
        """End the shell process."""
        await self._client._request("DELETE", f"/v1/sandboxes/{self.sandbox_id}/shells/{self.id}")


@guarded
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
