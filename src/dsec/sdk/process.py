"""A background process as the asynchronous SDK sees it: ``await sb.spawn("server")``.

The node runs the process and keeps its output; this handle (or another made later from
the pid, in any client: ``await sb.process(pid)``) reads it, waits for the end, signals it
and writes its stdin. ``on_stdout``/``on_stderr`` callbacks, when given, are fed from a
task of the SDK following the process; :meth:`AsyncProcess.wait` returns after the last.
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import signal as _signal
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

from dsec.api.errors import SandboxTimeout, error_from_wire
from dsec.api.models import ExecEvent, ExecResult, validated
from dsec.api.process import ProcessInfo, ProcessWaitRequest, SignalRequest, StdinRequest
from dsec.sdk.boundary import guarded, parse, parse_obj

if TYPE_CHECKING:
    from dsec.sdk.client import AsyncClient

__all__ = ["AsyncProcess", "OutputCallback", "deliver"]

# A callback gets each chunk of text as it comes; it may be a plain function or async.
OutputCallback = Callable[[str], Awaitable[None] | None]


async def deliver(ev: ExecEvent, on_stdout: OutputCallback | None,
                  on_stderr: OutputCallback | None) -> None:
    """Hand one output event to its callback (awaited if it is a coroutine function)."""
    cb = on_stdout if ev.type == "stdout" else on_stderr if ev.type == "stderr" else None
    if cb is not None:
        got = cb(ev.data)
        if inspect.isawaitable(got):
            await got


@guarded
class AsyncProcess:
    """A command running in the background in a sandbox, known by its pid."""

    pid: int
    sandbox_id: str
    info: ProcessInfo

    def __init__(self, client: AsyncClient, sandbox_id: str, info: ProcessInfo) -> None:
        self._client = client
        self.sandbox_id = sandbox_id
        self.pid = info.pid
        self.info = info
        self._base = f"/v1/sandboxes/{sandbox_id}/processes/{info.pid}"
        self._follower: asyncio.Task | None = None

    def __repr__(self) -> str:
        return f"<Process {self.pid} in {self.sandbox_id}: {self.info.cmd!r}>"

    def _follow(self, on_stdout: OutputCallback | None,
                on_stderr: OutputCallback | None) -> None:
        """Feed the callbacks from the process's output, in a task of this loop."""
        async def run() -> None:
            async for ev in self.stream():
                await deliver(ev, on_stdout, on_stderr)
        self._follower = asyncio.create_task(run())

    async def refresh(self) -> ProcessInfo:
        """Its state now, with the output kept so far (``stdout``, ``stderr``)."""
        self.info = parse(ProcessInfo, await self._client._request("GET", self._base))
        return self.info

    async def wait(self, timeout: float | None = None) -> ExecResult:
        """Wait for the end; the result carries the kept output. A non-zero exit is a
        result; still running after ``timeout`` seconds raises :class:`SandboxTimeout`
        (the process goes on)."""
        body = validated(ProcessWaitRequest, timeout=timeout).model_dump()
        resp = await self._client._request("POST", f"{self._base}/wait", json=body,
                                           timeout=None if timeout is None else timeout + 30)
        self.info = parse(ProcessInfo, resp)
        if self.info.running or self.info.result is None:
            raise SandboxTimeout(f"process {self.pid} in {self.sandbox_id} still runs after "
                                 f"{timeout:g}s")
        if self._follower is not None:
            await self._follower  # every callback has run once wait returns
        return self.info.result.model_copy(update={
            "stdout": self.info.stdout, "stderr": self.info.stderr,
            "stdout_truncated": self.info.stdout_truncated,
            "stderr_truncated": self.info.stderr_truncated, "pid": self.pid})

    async def kill(self, signal: int = int(_signal.SIGKILL)) -> None:
        """Send ``signal`` (SIGKILL by default) to the process group."""
        body = validated(SignalRequest, signal=signal).model_dump()
        await self._client._request("POST", f"{self._base}/signal", json=body)

    async def send_stdin(self, data: bytes | str, close: bool = False) -> None:
        """Write to its stdin (it was started with ``stdin_open=True``)."""
        if isinstance(data, str):
            data = data.encode()
        body = validated(StdinRequest, data=base64.b64encode(data).decode(),
                         close=close).model_dump()
        await self._client._request("POST", f"{self._base}/stdin", json=body)

    async def close_stdin(self) -> None:
        """Close its stdin: a program reading it sees the end of input."""
        await self.send_stdin(b"", close=True)

    async def stream(self, since: int = 0) -> AsyncIterator[ExecEvent]:
        """Its output chunks from the ``since``-th on (kept ones first, then live), then
        one ``exit`` event. Any number of followers may read one process."""
        async for line in self._client._stream_lines(f"{self._base}/events", None,
                                                      method="GET",
                                                      params={"since": since}):
            if "error" in line:
                raise error_from_wire(line, 500)
            yield parse_obj(ExecEvent, line, f"process {self.pid} events")
