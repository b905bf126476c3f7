"""Shell sessions: one long-lived ``/bin/sh`` per session, fed commands one at a time.

Each command runs in the shell itself (so ``cd`` and ``export`` persist), with stdin from
/dev/null (so it cannot eat what comes next), followed by a marker carrying a random token
and ``$?`` on both streams. A command that times out has its descendants killed through the
agent; the shell survives and prints the marker, so the session goes on.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import signal
import time
from dataclasses import dataclass, field

from dsec.api.errors import Conflict, SandboxStopped
from dsec.api.models import ExecResult, ShellRunRequest
from dsec.node.agent.client import AgentGone, AgentProcess
from dsec.node.execution import OutputCap

__all__ = ["ShellSession"]


@dataclass
class ShellSession:
    id: str
    sandbox_id: str
    proc: AgentProcess
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _buf: dict = field(default_factory=lambda: {"stdout": b"", "stderr": b""})
    ended: str | None = None  # why the shell is gone (a syntax error ends a plain sh)

    async def run(self, req: ShellRunRequest) -> ExecResult:
        if self.ended is not None:
            raise SandboxStopped(f"shell {self.id} {self.ended}; open a new shell")
        if self.lock.locked():
            raise Conflict(f"shell {self.id} is already running a command")
        async with self.lock:
            try:
                return await self._run(req)
            except asyncio.CancelledError:
                # Its caller went (its token revoked, the server stopping) mid-command: the
                # rest of the command's output would be read as the next command's, so the
                # command ends, and the session with it.
                self.ended = "ended: a command of it was cancelled before it finished"
                self.proc.signal_children(signal.SIGKILL)
                self.close()
                raise

    async def _run(self, req: ShellRunRequest) -> ExecResult:
        token = secrets.token_hex(8)
        mark = f"__DSEC_{token}__"
        script = (f"{{ {req.cmd}\n}} </dev/null; __dsec_rc=$?; "
                  f"printf '{mark}%d\\n' $__dsec_rc; printf '{mark}\\n' >&2\n")
        t0 = time.perf_counter()
        try:
            self.proc.write_stdin(script.encode())
            await self.proc.drain()
        except (ConnectionError, RuntimeError) as exc:  # the agent's end closed under us
            self.ended = "ended"
            raise SandboxStopped(f"shell {self.id} ended; open a new shell") from exc
        caps = {"stdout": OutputCap(req.max_output), "stderr": OutputCap(req.max_output)}
        pattern = {"stdout": re.compile(re.escape(mark).encode() + rb"(-?\d+)\n"),
                   "stderr": re.compile(re.escape(mark).encode() + rb"\n")}
        done: dict[str, re.Match | None] = {"stdout": None, "stderr": None}
        deadline = t0 + req.timeout if req.timeout else None
        timed_out = False
        while not (done["stdout"] and done["stderr"]):
            wait = None if deadline is None else max(0.0, deadline - time.perf_counter())
            try:
                kind, data = await asyncio.wait_for(self.proc.next_event(), wait)
            except asyncio.TimeoutError:
                if timed_out:
                    raise SandboxStopped(f"shell {self.id} does not answer") from None
                timed_out = True
                self.proc.signal_children(signal.SIGKILL)
                deadline = time.perf_counter() + 5.0
                continue
            except AgentGone as exc:
                self.ended = "ended"
                raise SandboxStopped(f"shell {self.id} ended") from exc
            if kind == "exit":
                self.ended = f"exited (code {self.proc.exit_code})"
                raise SandboxStopped(f"shell {self.id} {self.ended}")
            self._feed(kind, data, caps[kind], pattern[kind], done)
        code = int(done["stdout"].group(1))
        return ExecResult(exit_code=code, stdout=caps["stdout"].text(),
                          stderr=caps["stderr"].text(),
                          stdout_truncated=caps["stdout"].truncated,
                          stderr_truncated=caps["stderr"].truncated,
                          duration_ms=(time.perf_counter() - t0) * 1000, timed_out=timed_out)

    def _feed(self, kind: str, data: bytes, cap: OutputCap, pat: re.Pattern,
              done: dict) -> None:
        """Pass output to the cap, holding back a tail that could be the start of the marker."""
        buf = self._buf[kind] + data
        m = pat.search(buf)
        if m:
            cap.feed(buf[:m.start()])
            done[kind] = m
            self._buf[kind] = buf[m.end():]
            return
        keep = 40  # longer than any marker, so a marker split across chunks is found
        cap.feed(buf[:-keep] if len(buf) > keep else b"")
        self._buf[kind] = buf[-keep:] if len(buf) > keep else buf

    def close(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.close()
