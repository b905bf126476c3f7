"""Exec written once for every stateful backend, on top of the in-sandbox agent.

Output per stream is kept up to ``max_output`` bytes and the rest is read and dropped (so a
flood cannot stall the command or grow the node's memory); the timeout kills the whole
process group; an OOM kill is told apart from other SIGKILLs by the cgroup's counter.
"""

from __future__ import annotations

import asyncio
import base64
import codecs
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from dsec.api.errors import InvalidArgument, SandboxStopped
from dsec.api.limits import AGENT_MAX_ARGS, AGENT_MAX_FRAME
from dsec.api.models import ExecEvent, ExecRequest, ExecResult
from dsec.node.agent.client import AgentGone, AgentProcess, SpawnRequest
from dsec.node.backends.base import Backend, SandboxRecord
from dsec.node.users import resolve_user

__all__ = ["exec_events", "run_exec", "build_spawn", "OutputCap"]

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
KILL_GRACE_S = 5.0


@dataclass
class OutputCap:
    """Keeps the first ``limit`` bytes of a stream, decoded as UTF-8 across chunk borders."""

    limit: int
    kept: int = 0
    truncated: bool = False
    parts: list[str] = field(default_factory=list)
    _dec: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace"))

    def feed(self, data: bytes) -> str:
        room = self.limit - self.kept
        if room <= 0:
            self.truncated = self.truncated or bool(data)
            return ""
        if len(data) > room:
            data, self.truncated = data[:room], True
        self.kept += len(data)
        text = self._dec.decode(data)
        self.parts.append(text)
        return text

    def text(self) -> str:
        return "".join(self.parts) + self._dec.decode(b"", final=True)


def build_spawn(backend: Backend, rec: SandboxRecord, req: ExecRequest) -> SpawnRequest:
    argv = ["/bin/sh", "-c", req.cmd] if isinstance(req.cmd, str) else list(req.cmd)
    env = {"PATH": DEFAULT_PATH, "HOME": "/root", "HOSTNAME": rec.id}
    env.update(rec.runtime.get("image_env") or {})
    env.update(rec.spec.env)
    env.update(req.env)
    uid, gid = resolve_user(backend.files(rec), req.user or rec.runtime.get("image_user", "root"))
    cwd = req.cwd or rec.runtime.get("image_cwd") or "/"
    spawn = SpawnRequest(argv=argv, env=env, cwd=cwd, uid=uid, gid=gid, detach=req.background)
    check_spawn(spawn)
    return spawn


def check_spawn(spawn: SpawnRequest) -> None:
    """Refuse, naming the limit, a spawn the agent would refuse by dropping the connection
    (which would read as a stopped sandbox): the image's env adds to the caller's, and
    every byte outside printable ASCII grows sixfold in the agent's frame."""
    if len(spawn.env) > AGENT_MAX_ARGS:
        raise InvalidArgument(f"the command's environment has {len(spawn.env)} entries with "
                              f"the image's and the sandbox's; the agent takes at most "
                              f"{AGENT_MAX_ARGS}: pass fewer env entries")
    if (size := len(spawn.encode())) > AGENT_MAX_FRAME:
        raise InvalidArgument(f"the command, its env and cwd encode to {size} bytes for the "
                              f"in-sandbox agent, which takes at most {AGENT_MAX_FRAME}: "
                              "shorten them, or pass data through stdin or a file")


async def exec_events(backend: Backend, rec: SandboxRecord,
                      req: ExecRequest) -> AsyncIterator[ExecEvent]:
    """Yield output chunks as they come, then one ``exit`` event with the result."""
    user = req.user or rec.runtime.get("image_user", "root")
    if user.replace(":", "").isdigit() or user == "root":
        spawn = build_spawn(backend, rec, req)  # no file to read: skip the thread hop
    else:
        spawn = await asyncio.to_thread(build_spawn, backend, rec, req)
    stdin = base64.b64decode(req.stdin) if req.stdin else b""
    oom_before = backend.oom_kills(rec)
    t0 = time.perf_counter()
    try:
        proc = await AgentProcess.start(backend.connector(rec), spawn)
    except AgentGone as exc:
        raise SandboxStopped(f"sandbox {rec.id} is not answering: {exc}") from exc
    if req.background:
        proc.close()
        yield ExecEvent(type="exit", result=ExecResult(exit_code=0, pid=proc.pid))
        return
    try:
        async for ev in _relay(proc, req, stdin, t0, backend, rec, oom_before):
            yield ev
    finally:
        proc.close()


async def _relay(proc: AgentProcess, req: ExecRequest, stdin: bytes, t0: float,
                 backend: Backend, rec: SandboxRecord, oom_before: int
                 ) -> AsyncIterator[ExecEvent]:
    if stdin:
        proc.write_stdin(stdin)
    proc.close_stdin()
    caps = {"stdout": OutputCap(req.max_output), "stderr": OutputCap(req.max_output)}
    deadline = t0 + req.timeout if req.timeout else None
    timed_out = False
    while True:
        wait = None if deadline is None else max(0.0, deadline - time.perf_counter())
        try:
            kind, data = await asyncio.wait_for(proc.next_event(), wait)
        except asyncio.TimeoutError:
            if timed_out:
                raise SandboxStopped(f"command in {rec.id} did not die after SIGKILL") from None
            timed_out = True
            proc.send_signal(signal.SIGKILL)
            deadline = time.perf_counter() + KILL_GRACE_S
            continue
        except AgentGone as exc:
            raise SandboxStopped(f"sandbox {rec.id} went away during the command: {exc}") from exc
        if kind == "exit":
            break
        text = caps[kind].feed(data)
        if text:
            yield ExecEvent(type=kind, data=text)
    oom = proc.signal == signal.SIGKILL and backend.oom_kills(rec) > oom_before
    yield ExecEvent(type="exit", result=ExecResult(
        exit_code=proc.exit_code if proc.exit_code is not None else -1,
        stdout=caps["stdout"].text(), stderr=caps["stderr"].text(),
        stdout_truncated=caps["stdout"].truncated, stderr_truncated=caps["stderr"].truncated,
        duration_ms=(time.perf_counter() - t0) * 1000, timed_out=timed_out,
        oom_killed=oom and not timed_out, pid=proc.pid))


async def run_exec(backend: Backend, rec: SandboxRecord, req: ExecRequest) -> ExecResult:
    """Run to completion and return the result (output capped, never raised for exit != 0)."""
    result = None
    async for ev in exec_events(backend, rec, req):
        if ev.type == "exit":
            result = ev.result
    if result is None:
        raise InvalidArgument("exec ended without a result")
    return result
