"""The node's side of the trajectory log: record each mutating call, answer replays.

:class:`Recorder` sits in front of the node's verbs. Each verb is wrapped with
:func:`recorded` (or :func:`recorded_stream`), so :class:`~dsec.node.service.NodeService`
carries one decorator line per verb and knows nothing else about trajectories.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel

from dsec.api.errors import TrajectoryDiverged
from dsec.api.models import ExecEvent, ExecResult, FileInfo
from dsec.trajectory.commit import GroupCommit
from dsec.trajectory.log import TrajectoryLog
from dsec.trajectory.replay import KeyIndex, decide, fingerprint
from dsec.trajectory.retention import TrajectoryRetention

__all__ = ["Recorder", "FileWriteTap", "recorded", "recorded_stream", "MAX_LOGGED_CONTENT"]

M = TypeVar("M", bound=BaseModel)
log = logging.getLogger("dsec.trajectory")
MAX_LOGGED_CONTENT = 1 << 20  # file writes up to this size keep their bytes in the log


class Recorder:
    """Per node: the log file and, per sandbox, the index of keyed steps and the cursor."""

    def __init__(self, path: Path) -> None:
        self.log = TrajectoryLog(path)
        self._commit = GroupCommit(self.log, self._committed)
        self._index: dict[str, KeyIndex] = {}
        self._inflight: dict[tuple[str, str], asyncio.Future] = {}
        self._pruner: asyncio.Task | None = None

    def close(self) -> None:
        if self._pruner is not None:
            self._pruner.cancel()
        self._commit.flush()
        self.log.close()

    def ended(self, sb_id: str) -> None:
        """The sandbox stopped: its log's grace period starts."""
        self._index.pop(sb_id, None)
        self.log.ended(sb_id)

    def start_pruning(self, policy: TrajectoryRetention,
                      is_live: Callable[[str], bool]) -> None:
        """Apply ``policy`` every ``policy.interval_s``, in a thread, until :meth:`close`."""
        self._pruner = asyncio.create_task(self._prune_forever(policy, is_live))

    async def _prune_forever(self, policy: TrajectoryRetention,
                             is_live: Callable[[str], bool]) -> None:
        while True:
            await asyncio.sleep(policy.interval_s)
            try:
                r = await asyncio.to_thread(self.log.prune, policy, is_live)
            except Exception:  # the next pass tries again
                log.exception("trajectory pruning failed")
                continue
            if r.pruned:
                log.info("trajectory: pruned the logs of %d stopped sandboxes (%.1f -> %.1f MiB)",
                         len(r.pruned), r.bytes_before / (1 << 20), r.bytes_after / (1 << 20))

    def index(self, sb_id: str) -> KeyIndex:
        idx = self._index.get(sb_id)
        if idx is None:
            idx = self._index[sb_id] = KeyIndex.of(self.log.keyed(sb_id))
        return idx

    async def _decide(self, sb_id: str, step: str | None, fp: str):
        # The same key still running (a client retrying after a lost response) waits for
        # the first run and is then answered from the log instead of running twice.
        while step is not None and (fut := self._inflight.get((sb_id, step))) is not None:
            await asyncio.shield(fut)
        try:
            decision = decide(self.index(sb_id), step, fp)
        except TrajectoryDiverged as exc:
            self.log.audit(sb_id, "trajectory_diverged", exc.message)
            raise
        self.index(sb_id).cursor = decision.cursor
        return decision

    async def call(self, sb_id: str, kind: str, request: BaseModel,
                   run: Callable[[], Awaitable[M]], result_type: type[M],
                   context: dict | None = None) -> M:
        """Answer ``request`` from the log, or run it live and append it.

        ``context`` (a shell id, say) is logged with the request but is no part of the
        step's identity: a replay may come through another shell."""
        if getattr(request, "grading", False):
            return await run()  # the grading step's output may quote protected files
        step = getattr(request, "step", None)
        req = request.model_dump(exclude={"step"}) | (context or {})
        fp = fingerprint(kind, req)
        decision = await self._decide(sb_id, step, fp)
        if decision.action == "replay":
            entry = self.log.entry(sb_id, decision.seq)
            return result_type.model_validate(entry.result)
        with self._running(sb_id, step):
            result = await run()
            await self._commit.append(sb_id, step, kind, fp, req, result.model_dump())
        return result

    async def stream(self, sb_id: str, request: BaseModel,
                     run: Callable[[], AsyncIterator[ExecEvent]]) -> AsyncIterator[ExecEvent]:
        """A streamed exec: replayed as one chunk per stream, then the exit."""
        if getattr(request, "grading", False):  # as in call: never logged, never replayed
            async for ev in run():
                yield ev
            return
        step = getattr(request, "step", None)
        req = request.model_dump(exclude={"step"})
        fp = fingerprint("exec", req)
        decision = await self._decide(sb_id, step, fp)
        if decision.action == "replay":
            result = ExecResult.model_validate(self.log.entry(sb_id, decision.seq).result)
            for kind in ("stdout", "stderr"):
                if getattr(result, kind):
                    yield ExecEvent(type=kind, data=getattr(result, kind))
            yield ExecEvent(type="exit", result=result)
            return
        with self._running(sb_id, step):
            async for ev in run():
                if ev.type == "exit" and ev.result is not None:
                    await self._commit.append(sb_id, step, "exec", fp, req,
                                              ev.result.model_dump())
                yield ev

    def record_write(self, sb_id: str, tap: FileWriteTap, info: FileInfo) -> None:
        """A file write through the files API (not keyed: logged for provenance)."""
        req = tap.request()
        self._commit.flush()  # after the calls that ended before it
        self.log.append(sb_id, None, "file_write", fingerprint("file_write", req), req,
                        info.model_dump())

    def _committed(self, item: tuple, seq: int) -> None:
        sb_id, step, _kind, fp, _req, _result = item
        idx = self._index.get(sb_id)  # one not loaded yet reads this entry from the log
        if step is not None and idx is not None and step not in idx.by_key:
            idx.add(step, seq, fp)

    def _running(self, sb_id: str, step: str | None) -> _Running:
        return _Running(self._inflight, (sb_id, step) if step is not None else None)


class _Running:
    """Marks a keyed step as running while its body executes."""

    def __init__(self, table: dict | None, key: tuple[str, str] | None) -> None:
        self.table, self.key = table, key

    def __enter__(self) -> _Running:
        if self.key is not None:
            self.table[self.key] = asyncio.get_running_loop().create_future()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.key is not None:
            self.table.pop(self.key).set_result(None)


class FileWriteTap:
    """Sees a file write's bytes go by: hash, size, and the bytes themselves if small."""

    def __init__(self, path: str, mode: int) -> None:
        self.path, self.mode = path, mode
        self.size = 0
        self._hash = hashlib.sha256()
        self._kept: list[bytes] | None = []

    def feed(self, chunk: bytes) -> bytes:
        self.size += len(chunk)
        self._hash.update(chunk)
        if self._kept is not None:
            self._kept.append(chunk)
            if self.size > MAX_LOGGED_CONTENT:
                self._kept = None
        return chunk

    def request(self) -> dict:
        content = None if self._kept is None else base64.b64encode(b"".join(self._kept)).decode()
        return {"path": self.path, "mode": self.mode, "size": self.size,
                "sha256": self._hash.hexdigest(), "content_b64": content}


def recorded(kind: str, result_type: type[BaseModel]):
    """Wrap a node verb ``(self, sb_id, ..., request)`` with the trajectory log."""
    def deco(fn):
        @functools.wraps(fn)
        async def wrapper(self, sb_id: str, *args):
            self._get(sb_id)  # an unknown sandbox is NotFound, even for a logged step
            context = {"shell": args[0]} if len(args) > 1 else None
            return await self.trajectory.call(sb_id, kind, args[-1],
                                              lambda: fn(self, sb_id, *args), result_type,
                                              context)
        return wrapper
    return deco


def recorded_stream(fn):
    """Wrap the streaming exec verb ``(self, sb_id, request)`` with the trajectory log."""
    @functools.wraps(fn)
    async def wrapper(self, sb_id: str, req):
        self._get(sb_id)
        async for ev in self.trajectory.stream(sb_id, req, lambda: fn(self, sb_id, req)):
            yield ev
    return wrapper
