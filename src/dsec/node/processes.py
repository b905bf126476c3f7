"""Background processes of a node's sandboxes: started, kept and followed by pid.

Each process runs :func:`~dsec.node.execution.exec_events` in a task of the node, so its
output is read as it comes (a flood cannot stall it) and kept, up to ``max_output`` per
stream, as the list of chunks a follower replays from any position before it waits for
the next. A handle in any client (``sb.process(pid)``) reads the same record. Records of
ended processes are kept for :data:`KEEP_ENDED` per sandbox, and their output for
:data:`KEEP_ENDED_BYTES`, then the oldest go (every E2B command is such a process: a loop
of commands with large output must not pile it up in the node).

The processes outlive the node agent: each is started as a *kept* command of the
in-sandbox agent, which goes on running it when its connection drops (a node restart) and
holds its output until a node follows it again. The record lives in the node's memory, so
after a restart :meth:`Processes.recover` asks each sandbox's agent for the kept commands
nobody follows and follows them again by pid, from a note the command was started with
(:class:`_Note`); what it printed before the restart went with the old record, what it
printed since comes first.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from dsec.api.errors import Conflict, NotFound, shorten
from dsec.api.models import ExecEvent, ExecResult
from dsec.api.models import validated
from dsec.api.process import ProcessInfo, ProcessRequest
from dsec.node.agent.client import AgentGone, AgentProcess, kept_commands
from dsec.node.backends.base import Backend, SandboxRecord
from dsec.node.execution import exec_events

__all__ = ["Processes", "KEEP_ENDED", "KEEP_ENDED_BYTES"]

KEEP_ENDED = 64
KEEP_ENDED_BYTES = 64 << 20  # output of ended processes kept per sandbox
_RECOVER_S = 10.0  # how long a restarted node waits for a sandbox's agent to answer
log = logging.getLogger(__name__)


@dataclass
class _Note:
    """What a node needs to follow a kept process again: the agent holds it as its tag."""

    cmd: str | list[str]
    started_at: float
    pty: bool
    stdin_open: bool
    max_output: int
    deadline: float | None  # wall-clock time its timeout kills it, None for none

    def encode(self) -> str:
        cmd = self.cmd if len(json.dumps(self.cmd)) <= 2048 else str(self.cmd)[:2048]
        body = json.dumps({**self.__dict__, "cmd": cmd}, separators=(",", ":"))
        return base64.urlsafe_b64encode(body.encode()).decode("ascii")

    @classmethod
    def decode(cls, tag: str) -> _Note | None:
        try:
            return cls(**json.loads(base64.urlsafe_b64decode(tag)))
        except (ValueError, TypeError):
            return None  # not one of ours (or cut short): the process is left alone


@dataclass
class _Process:
    cmd: str | list[str]
    started_at: float
    pty: bool = False
    stdin_open: bool = False
    size: int = 0  # characters of output kept
    proc: AgentProcess | None = None
    events: list[ExecEvent] = field(default_factory=list)
    result: ExecResult | None = None
    task: asyncio.Task | None = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc and self.proc.pid is not None else -1

    def add(self, ev: ExecEvent) -> None:
        if ev.type == "exit":
            self.result = ev.result.model_copy(update={"stdout": "", "stderr": ""}) \
                if ev.result else ExecResult(exit_code=-1)
        else:
            self.events.append(ev)
            self.size += len(ev.data)
        self._changed.set()
        self._changed = asyncio.Event()

    def info(self, output: bool) -> ProcessInfo:
        out = {"stdout": "", "stderr": ""}
        if output:
            for ev in self.events:
                out[ev.type] += ev.data
        r = self.result
        return ProcessInfo(pid=self.pid, cmd=self.cmd, started_at=self.started_at, pty=self.pty,
                           running=r is None, result=r, stdout=out["stdout"],
                           stderr=out["stderr"],
                           stdout_truncated=bool(r and r.stdout_truncated),
                           stderr_truncated=bool(r and r.stderr_truncated))

    async def follow(self, since: int) -> AsyncIterator[ExecEvent]:
        i = since
        while True:
            while i < len(self.events):
                yield self.events[i]
                i += 1
            if self.result is not None:
                yield ExecEvent(type="exit", result=self.result)
                return
            await self._changed.wait()


class Processes:
    """Every background process of one node, by sandbox and pid."""

    def __init__(self) -> None:
        self._by_sandbox: dict[str, dict[int, _Process]] = {}
        self._recovering: dict[str, asyncio.Task] = {}

    async def start(self, backend: Backend, rec: SandboxRecord,
                    req: ProcessRequest) -> ProcessInfo:
        """Start ``req`` and return once it runs (its pid known)."""
        entry = _Process(cmd=req.cmd, started_at=time.time(), pty=req.pty is not None,
                         stdin_open=req.stdin_open or req.pty is not None)
        note = _Note(cmd=req.cmd, started_at=entry.started_at, pty=entry.pty,
                     stdin_open=entry.stdin_open, max_output=req.max_output,
                     deadline=entry.started_at + req.timeout if req.timeout else None)
        return await self._follow(backend, rec, req, entry, keep=note.encode())

    def recover(self, backend: Backend, rec: SandboxRecord) -> None:
        """After a node restart: follow again, in the background, the processes the
        sandbox's agent kept running. Calls about the sandbox wait for it (:meth:`ready`)."""
        self._recovering[rec.id] = asyncio.create_task(self._recover(backend, rec))

    async def ready(self, sb_id: str) -> None:
        """Return once the sandbox's processes from before a restart are followed again."""
        task = self._recovering.get(sb_id)
        if task is not None:
            await asyncio.shield(task)

    async def _recover(self, backend: Backend, rec: SandboxRecord) -> None:
        try:  # bounded: calls about the sandbox wait for this
            found = await asyncio.wait_for(kept_commands(backend.connector(rec)), _RECOVER_S)
        except (AgentGone, OSError, asyncio.TimeoutError) as exc:
            log.warning("sandbox %s: kept processes not recovered: %s", rec.id, exc)
            return
        for kept in found:
            note = _Note.decode(kept.tag)
            if note is None or kept.pid in self._by_sandbox.get(rec.id, {}):
                continue
            left = None if note.deadline is None else max(0.001, note.deadline - time.time())
            req = validated(ProcessRequest, cmd=["attach"], max_output=note.max_output,
                            timeout=left)
            entry = _Process(cmd=note.cmd, started_at=note.started_at, pty=note.pty,
                             stdin_open=note.stdin_open)
            try:
                await asyncio.wait_for(self._follow(backend, rec, req, entry,
                                                    attach=kept.pid), _RECOVER_S)
            except Exception as exc:  # one process lost, not the others
                log.warning("sandbox %s: process %d not followed again: %s", rec.id,
                            kept.pid, exc)

    async def _follow(self, backend: Backend, rec: SandboxRecord, req: ProcessRequest,
                      entry: _Process, keep: str | None = None,
                      attach: int | None = None) -> ProcessInfo:
        started: asyncio.Future[AgentProcess] = asyncio.get_running_loop().create_future()

        def on_start(proc: AgentProcess) -> None:
            entry.proc = proc
            started.set_result(proc)

        async def run() -> None:
            try:
                async for ev in exec_events(backend, rec, req, stream=True, on_start=on_start,
                                            keep_stdin=entry.stdin_open, keep=keep,
                                            attach=attach):
                    entry.add(ev)
            except Exception as exc:  # the sandbox went away: the process ended with it
                if not started.done():
                    started.set_exception(exc)
                entry.add(ExecEvent(type="exit", result=ExecResult(exit_code=-1,
                                                                   stderr=str(exc))))

        entry.task = asyncio.create_task(run())
        await asyncio.shield(started)  # a spawn refused raises here, as exec would
        procs = self._by_sandbox.setdefault(rec.id, {})
        procs[entry.pid] = entry
        self._forget_old(procs)
        return entry.info(output=False)

    def _forget_old(self, procs: dict[int, _Process]) -> None:
        ended = [pid for pid, p in procs.items() if p.result is not None]  # oldest first
        kept = sum(procs[pid].size for pid in ended)
        while ended and (len(ended) > KEEP_ENDED or kept > KEEP_ENDED_BYTES):
            kept -= procs.pop(ended.pop(0)).size

    def _get(self, sb_id: str, pid: int) -> _Process:
        entry = self._by_sandbox.get(sb_id, {}).get(pid)
        if entry is None:
            raise NotFound(f"no background process with pid {pid} in sandbox {shorten(sb_id)} "
                           f"(only processes started with spawn are kept, the last "
                           f"{KEEP_ENDED} ended ones among them)")
        return entry

    def list(self, sb_id: str) -> list[ProcessInfo]:
        return [p.info(output=False) for p in self._by_sandbox.get(sb_id, {}).values()]

    def get(self, sb_id: str, pid: int) -> ProcessInfo:
        return self._get(sb_id, pid).info(output=True)

    def events(self, sb_id: str, pid: int, since: int = 0) -> AsyncIterator[ExecEvent]:
        """The output chunks from position ``since`` (replayed, then live), then the exit."""
        return self._get(sb_id, pid).follow(since)

    async def wait(self, sb_id: str, pid: int, timeout: float | None) -> ProcessInfo:
        entry = self._get(sb_id, pid)
        if entry.task is not None and entry.result is None:
            await asyncio.wait({entry.task}, timeout=timeout)  # raises neither way
        return entry.info(output=True)

    async def signal(self, sb_id: str, pid: int, signum: int) -> None:
        entry = self._get(sb_id, pid)
        if entry.result is None and entry.proc is not None:
            entry.proc.send_signal(signum)

    async def stdin(self, sb_id: str, pid: int, data_b64: str, close: bool) -> None:
        entry = self._get(sb_id, pid)
        if data_b64 and not entry.stdin_open:
            raise Conflict(f"process {pid} in sandbox {sb_id} was started without stdin_open "
                           "(its stdin is closed): start it with stdin_open=True to write to it")
        if entry.result is not None or entry.proc is None:
            return  # it ended: what it would have read goes nowhere, as with a closed pipe
        try:
            if data_b64:
                entry.proc.write_stdin(base64.b64decode(data_b64))
            if close:
                entry.proc.close_stdin()
            await entry.proc.drain()
        except AgentGone:
            pass  # ending now; its follower reports how

    async def resize(self, sb_id: str, pid: int, rows: int, cols: int) -> None:
        """Resize the terminal of a process started with ``pty`` (SIGWINCH reaches it)."""
        entry = self._get(sb_id, pid)
        if not entry.pty:
            raise Conflict(f"process {pid} in sandbox {sb_id} runs without a terminal: only a "
                           "process started with pty can be resized")
        if entry.result is not None or entry.proc is None:
            return  # it ended: nothing is left to resize
        try:
            entry.proc.resize(rows, cols)
            await entry.proc.drain()
        except AgentGone:
            pass

    def close(self) -> None:
        """The node stops: its followers go, the processes run on in their sandboxes (the
        next node follows them again with :meth:`recover`)."""
        for task in self._recovering.values():
            task.cancel()
        for procs in self._by_sandbox.values():
            for entry in procs.values():
                if entry.task is not None:
                    entry.task.cancel()
        self._by_sandbox.clear()
        self._recovering.clear()

    def drop(self, sb_id: str) -> None:
        """The sandbox stopped: forget its processes (they ended with it)."""
        if (task := self._recovering.pop(sb_id, None)) is not None:
            task.cancel()
        for entry in self._by_sandbox.pop(sb_id, {}).values():
            if entry.result is None:  # its followers and waiters hear how it ended
                entry.add(ExecEvent(type="exit", result=ExecResult(
                    exit_code=-1, stderr="the sandbox was stopped")))
            if entry.task is not None:
                entry.task.cancel()
