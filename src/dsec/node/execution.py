"""Exec written once for every stateful backend, on top of the in-sandbox agent.

Output per stream passes up to ``max_output`` bytes and the rest is read and dropped (so a
flood cannot stall the command). A result keeps what passed in one buffer per stream,
decoded once at the end; a stream keeps only a small head of it for the trajectory log, so
its memory does not grow with the output. Stdin goes a frame at a time, decoded piece by
piece and drained between frames. The timeout kills the whole process group; an OOM kill
(of the command or a child of it) is told apart from other SIGKILLs by the cgroup's counter.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import codecs
import re
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

from dsec.api.errors import InvalidArgument, SandboxStopped
from dsec.api.limits import AGENT_MAX_ARGS, AGENT_MAX_FRAME
from dsec.api.models import ExecEvent, ExecRequest, ExecResult
from dsec.node.agent.client import MAX_FRAME, AgentGone, AgentProcess, SpawnRequest
from dsec.node.backends.base import Backend, SandboxRecord
from dsec.node.users import resolve_user

__all__ = ["exec_events", "run_exec", "build_spawn", "OutputCap", "STREAM_KEPT"]

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
KILL_GRACE_S = 5.0
STREAM_KEPT = 1 << 20  # per stream, what a streamed exec's exit result carries (for the log)
_B64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")


@dataclass
class OutputCap:
    """Passes the first ``limit`` bytes of a stream and keeps the first ``keep`` of them
    (all by default) in one buffer: no list of pieces, no decoding per chunk."""

    limit: int
    keep: int | None = None
    passed: int = 0
    truncated: bool = False
    _buf: bytearray = field(default_factory=bytearray)

    def feed(self, data: bytes) -> bytes:
        """The part of ``data`` within the limit; empty once the limit is reached."""
        room = self.limit - self.passed
        if len(data) > room:
            data, self.truncated = data[:max(room, 0)], True
        self.passed += len(data)
        space = (self.limit if self.keep is None else self.keep) - len(self._buf)
        if data and space > 0:
            self._buf += data if len(data) <= space else data[:space]
        return data

    def holds(self, needle: bytes) -> bool:
        """Whether what was kept holds ``needle``."""
        return needle in self._buf

    def text(self) -> str:
        """The kept bytes as UTF-8 text (invalid bytes replaced); the buffer is released,
        so the output is held once, not twice, from here on."""
        text = self._buf.decode("utf-8", errors="replace")
        self._buf = bytearray()
        return text


def stdin_frames(b64: str | None) -> Iterator[bytes]:
    """Base64 stdin as frames for the agent, decoded a frame at a time (a clean base64
    string, as the SDK sends, is never decoded whole). Malformed base64 is refused here,
    before anything runs."""
    if not b64:
        return iter(())
    if len(b64) % 4 == 0 and _B64.fullmatch(b64):
        step = MAX_FRAME // 3 * 4  # characters that decode to at most one frame
        return (base64.b64decode(b64[i:i + step]) for i in range(0, len(b64), step))
    try:
        data = memoryview(base64.b64decode(b64))
    except (binascii.Error, ValueError) as exc:
        raise InvalidArgument(f"stdin must be base64: {exc}") from exc
    return (bytes(data[i:i + MAX_FRAME]) for i in range(0, len(data), MAX_FRAME))


def build_spawn(backend: Backend, rec: SandboxRecord, req: ExecRequest) -> SpawnRequest:
    argv = ["/bin/sh", "-c", req.cmd] if isinstance(req.cmd, str) else list(req.cmd)
    env = {"PATH": DEFAULT_PATH, "HOME": "/root", "HOSTNAME": rec.id}
    env.update(rec.runtime.get("image_env") or {})
    env.update(rec.spec.env)
    env.update(req.env)
    uid, gid = resolve_user(lambda: backend.files(rec),
                            req.user or rec.runtime.get("image_user", "root"))
    cwd = req.cwd or rec.runtime.get("image_cwd") or "/"
    protected = list(rec.spec.protected_paths)
    # the grading step reads and writes them, but makes no other name for what they hold
    # (a hard link agent commands could read by): agent/protect.h
    spawn = SpawnRequest(argv=argv, env=env, cwd=cwd, uid=uid, gid=gid, detach=req.background,
                         protect=[] if req.grading else protected,
                         nolink=protected if req.grading else [])
    if (size := getattr(req, "pty", None)) is not None:  # a ProcessRequest on a terminal
        spawn.pty, spawn.rows, spawn.cols = True, size.rows, size.cols
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
    if _frame_bound(spawn) > AGENT_MAX_FRAME and (size := len(spawn.encode())) > AGENT_MAX_FRAME:
        raise InvalidArgument(f"the command, its env and cwd encode to {size} bytes for the "
                              f"in-sandbox agent, which takes at most {AGENT_MAX_FRAME}: "
                              "shorten them, or pass data through stdin or a file")


def _frame_bound(spawn: SpawnRequest) -> int:
    """At least the size of ``spawn``'s frame, without encoding it (the frame is encoded
    once, when it is sent): a character is at most 4 UTF-8 bytes, each sent as a latin-1
    code point that JSON escapes to at most 6 bytes; quotes, commas, keys and numbers
    take the rest."""
    strings = [*spawn.argv, spawn.cwd, spawn.tag, *spawn.protect, *spawn.nolink]
    chars = sum(map(len, strings)) + sum(len(k) + len(v) + 1 for k, v in spawn.env.items())
    return 24 * chars + 3 * (len(strings) + len(spawn.env)) + 512


async def exec_events(backend: Backend, rec: SandboxRecord, req: ExecRequest,
                      stream: bool = True,
                      on_start: Callable[[AgentProcess], None] | None = None,
                      keep_stdin: bool = False, keep: str | None = None,
                      attach: int | None = None) -> AsyncIterator[ExecEvent]:
    """Yield output chunks as they come, then one ``exit`` event with the result.

    A stream's result carries at most :data:`STREAM_KEPT` bytes of each stream (its chunks
    went by already). With ``stream=False`` only the exit is yielded, and its result keeps
    the output up to ``max_output``. ``on_start`` gets the process once it runs (a
    background process's handle signals it); ``keep_stdin`` leaves its stdin open after
    ``req.stdin`` for later writes. With ``keep`` (the agent's note about it) the command
    outlives the agent connection, so a node restart does not end it; ``attach`` follows
    such a command again by pid instead of starting ``req`` (whose timeout and output cap
    still apply)."""
    stdin = stdin_frames(req.stdin)
    oom_before = backend.oom_kills(rec)
    t0 = time.perf_counter()
    try:
        if attach is not None:
            proc = await AgentProcess.attach(backend.connector(rec), attach)
        else:
            spawn = await _spawn(backend, rec, req)
            if keep is not None:
                spawn.keep, spawn.tag = True, keep
            proc = await AgentProcess.start(backend.connector(rec), spawn,
                                            no_stdin=not (req.stdin or keep_stdin))
    except AgentGone as exc:
        raise SandboxStopped(f"sandbox {rec.id} is not answering: {exc}") from exc
    if on_start is not None:
        on_start(proc)
    if req.background:
        proc.close()
        yield ExecEvent(type="exit", result=ExecResult(exit_code=0, pid=proc.pid))
        return
    # No stdin: it was closed with the spawn, and no task is needed to feed it.
    feeder = asyncio.create_task(_feed_stdin(proc, stdin, close=not keep_stdin)) \
        if req.stdin else None
    try:
        async for ev in _relay(proc, req, stream, t0, backend, rec, oom_before, feeder):
            yield ev
    finally:
        if feeder is not None:
            feeder.cancel()
        proc.close()


async def _spawn(backend: Backend, rec: SandboxRecord, req: ExecRequest) -> SpawnRequest:
    user = req.user or rec.runtime.get("image_user", "root")
    if user.replace(":", "").isdigit() or user == "root":
        return build_spawn(backend, rec, req)  # no file to read: skip the thread hop
    return await asyncio.to_thread(build_spawn, backend, rec, req)


async def _feed_stdin(proc: AgentProcess, frames: Iterator[bytes], close: bool = True) -> None:
    """Send stdin beside the output loop, draining after each frame, then close it."""
    try:
        for frame in frames:
            proc.write_stdin(frame)
            await proc.drain()
        if close:
            proc.close_stdin()
        await proc.drain()
    except AgentGone:
        pass  # the output loop reports the end of the command or of the sandbox


async def _relay(proc: AgentProcess, req: ExecRequest, stream: bool, t0: float,
                 backend: Backend, rec: SandboxRecord, oom_before: int,
                 feeder: asyncio.Task | None) -> AsyncIterator[ExecEvent]:
    keep = min(req.max_output, STREAM_KEPT) if stream else None
    caps = {k: OutputCap(req.max_output, keep) for k in ("stdout", "stderr")}
    decoders = {k: codecs.getincrementaldecoder("utf-8")(errors="replace") for k in caps}
    deadline = t0 + req.timeout if req.timeout else None
    timed_out = False
    while True:
        wait = None if deadline is None else max(0.0, deadline - time.perf_counter())
        try:
            # asyncio.timeout, not wait_for: wait_for wraps every event read in a task
            async with asyncio.timeout(wait):
                kind, data = await proc.next_event()
        except TimeoutError:
            if timed_out:
                raise SandboxStopped(f"command in {rec.id} did not die after SIGKILL") from None
            timed_out = True
            proc.send_signal(signal.SIGKILL)
            deadline = time.perf_counter() + KILL_GRACE_S
            continue
        except AgentGone as exc:
            raise SandboxStopped(f"sandbox {rec.id} went away during the command: {exc}") from exc
        if kind == "exit":
            if feeder is not None:
                feeder.cancel()  # stdin the command never read
            break
        passed = caps[kind].feed(data)
        if stream and passed and (text := decoders[kind].decode(passed)):
            yield ExecEvent(type=kind, data=text)
    if stream:
        for kind, dec in decoders.items():
            if text := dec.decode(b"", final=True):
                yield ExecEvent(type=kind, data=text)
    oom = _shows_a_kill(proc, caps["stderr"]) and backend.oom_kills(rec) > oom_before
    yield ExecEvent(type="exit", result=ExecResult(
        exit_code=proc.exit_code if proc.exit_code is not None else -1,
        stdout=caps["stdout"].text(), stderr=caps["stderr"].text(),
        stdout_truncated=caps["stdout"].truncated, stderr_truncated=caps["stderr"].truncated,
        duration_ms=(time.perf_counter() - t0) * 1000, timed_out=timed_out,
        oom_killed=oom and not timed_out, pid=proc.pid))


def _shows_a_kill(proc: AgentProcess, stderr: OutputCap) -> bool:
    """Whether the result shows that a process of the command may have been SIGKILLed:
    the command itself, a shell passing on a child's status (137), or a shell's report of
    a killed child on stderr ("Killed": busybox sh, bash). Only then is the sandbox's OOM
    counter read a second time, which decides; an exec that shows nothing (``true``)
    pays no read for it. The price: a child killed silently (its status dropped, its
    shell's stderr elsewhere or past the output cap) is not reported as an OOM kill."""
    return (proc.signal == signal.SIGKILL or proc.exit_code == 128 + signal.SIGKILL
            or stderr.holds(b"Killed"))


async def run_exec(backend: Backend, rec: SandboxRecord, req: ExecRequest) -> ExecResult:
    """Run to completion and return the result (output capped, never raised for exit != 0)."""
    result = None
    async for ev in exec_events(backend, rec, req, stream=False):
        if ev.type == "exit":
            result = ev.result
    if result is None:
        raise InvalidArgument("exec ended without a result")
    return result
