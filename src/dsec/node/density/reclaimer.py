"""Reclaims of paused sandboxes, in the background with bounded parallelism.

A pause freezes at once and queues a reclaim; at most ``parallel`` run at a time (each
compresses on a core). A request for a sandbox whose reclaim is queued or running cancels
it: a queued one never starts, a running one ends after its current step. What a reclaim
did is kept in the sandbox's record (``runtime["reclaim"]``), so a restarted node still
restores the limits of a sandbox it finds paused and swapped out.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from dsec.node.backends.base import Backend, ReclaimPlan, SandboxRecord

__all__ = ["Reclaimer"]

log = logging.getLogger("dsec.node.density")
KEY = "reclaim"


@dataclass
class _Job:
    task: asyncio.Task
    cancel: threading.Event
    started: bool = False


class Reclaimer:
    """See the module docstring. ``persist(rec)`` saves a record (the node's store)."""

    def __init__(self, parallel: int, persist: Callable[[SandboxRecord], None]) -> None:
        self._sem = asyncio.Semaphore(parallel)
        self._persist = persist
        self._jobs: dict[str, _Job] = {}

    def start(self, rec: SandboxRecord, backend: Backend, plan: ReclaimPlan) -> None:
        """Queue a reclaim of paused sandbox ``rec``."""
        if not backend.can_reclaim or rec.id in self._jobs:
            return
        cancel = threading.Event()
        plan = ReclaimPlan(plan.swap_bytes, plan.step_bytes, cancel.is_set)
        task = asyncio.get_running_loop().create_task(self._run(rec, backend, plan, cancel))
        self._jobs[rec.id] = _Job(task, cancel)
        task.add_done_callback(lambda _t, i=rec.id: self._done(i, task))

    def _done(self, sb_id: str, task: asyncio.Task) -> None:
        job = self._jobs.get(sb_id)
        if job is not None and job.task is task:
            del self._jobs[sb_id]

    async def _run(self, rec: SandboxRecord, backend: Backend, plan: ReclaimPlan,
                   cancel: threading.Event) -> None:
        async with self._sem:
            if cancel.is_set():
                return
            self._jobs[rec.id].started = True
            rec.runtime[KEY] = {"state": "reclaiming", "since": time.time()}
            self._persist(rec)  # before any limit moves: a crash leaves a record to undo
            t0 = time.perf_counter()
            try:
                res = await asyncio.to_thread(backend.reclaim, rec, plan)
            except Exception as exc:  # e.g. the sandbox was stopped under it
                log.warning("reclaim of %s failed: %s", rec.id, exc)
                rec.runtime[KEY] = {"state": "failed", "note": str(exc)[:300]}
            else:
                rec.runtime[KEY] = {"state": "reclaimed" if res.complete else "partial",
                                    "freed": res.freed_bytes, "held": res.after_bytes,
                                    "swapped": res.swapped_bytes, "note": res.note,
                                    "seconds": round(time.perf_counter() - t0, 3)}
                log.info("reclaimed %s: %d MiB freed, %d MiB in swap, %d MiB held%s", rec.id,
                         res.freed_bytes >> 20, res.swapped_bytes >> 20, res.after_bytes >> 20,
                         f" ({res.note})" if res.note else "")
            if rec.state == "paused":
                self._persist(rec)

    async def cancel(self, sb_id: str) -> None:
        """Stop the sandbox's reclaim (queued: never starts; running: ends after a step)."""
        job = self._jobs.get(sb_id)
        if job is None:
            return
        job.cancel.set()
        if not job.started:  # still queued behind other reclaims: drop it now
            job.task.cancel()
        await asyncio.gather(asyncio.shield(job.task), return_exceptions=True)

    async def undo(self, rec: SandboxRecord, backend: Backend) -> None:
        """Before a resume: cancel the reclaim, restore limits and read swapped memory back."""
        await self.cancel(rec.id)
        if rec.runtime.pop(KEY, None) is not None:
            await asyncio.to_thread(backend.restore, rec)

    def busy(self) -> int:
        """Reclaims queued or running."""
        return len(self._jobs)

    async def close(self) -> None:
        for job in list(self._jobs.values()):
            job.cancel.set()
        await asyncio.gather(*(j.task for j in list(self._jobs.values())),
                             return_exceptions=True)
