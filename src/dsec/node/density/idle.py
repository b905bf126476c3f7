"""Idle reclaim: a running sandbox nobody asked anything of for a while gives cold pages back.

Every ``idle_reclaim_interval_s`` the node looks at its running sandboxes. One idle for its
``idle_reclaim_s`` (the sandbox's own, else the node's) gets one small step of reclaim
(:meth:`~dsec.node.backends.base.Backend.reclaim_idle`: v2 ``memory.reclaim``, v1 a limit
lowered and put back), without being frozen, so its memory drains gradually, coldest pages
first. A request still running (a long exec) keeps it active. It stops for this idle
spell when a step frees almost nothing, when the pages it pushes come straight back
(refaults: more than half of what the last step freed; its processes are using them),
or when the cgroup is stalled on memory (PSI, where the kernel keeps it per cgroup). CPU
is no sign either way: a command that computes on its own loses only pages it does not
touch, and an idle shell polling every 0.1 s used 12-13 % of a core under TCG (kernel
time of its forks), more than any fixed busy line would allow. Any request
marks the sandbox active (``last_active_at``): the next step is not taken, and at most one
step already under way finishes, so a request never waits for more than that.

:func:`decide` is the policy, free of I/O; :class:`IdleReclaimer` runs it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from dsec.node.backends.base import Backend, ReclaimPlan, SandboxRecord

__all__ = ["IDLE_KEY", "IdleSpell", "IdleReclaimer", "decide"]

log = logging.getLogger("dsec.node.density")
IDLE_KEY = "idle_reclaim"
PAGE = 4096
REFAULT_PAGES = 256   # the fewest refaults between two steps that mean "in use" (1 MiB)
PRESSURE_PCT = 1.0    # the cgroup stalled on memory this much (avg10): leave it alone


@dataclass
class IdleSpell:
    """One sandbox's current stretch without requests, as the reclaimer saw it."""

    since: float               # its last_active_at when the spell began
    refaults: int | None = None  # the cgroup's count after the last step
    last_freed: int = 0        # what the last step freed
    freed: int = 0
    swapped: int = 0
    done: str = ""             # why it stopped for this spell ('' while going on)


def decide(now: float, last_active_at: float, idle_s: float | None,
           spell: IdleSpell | None, in_flight: bool = False) -> str:
    """``"step"`` when the sandbox is due a reclaim step, else why not. ``in_flight``: a
    request of it is still running."""
    if not idle_s:
        return "off"
    if in_flight or now - last_active_at < idle_s:
        return "active"
    if spell is not None and spell.since == last_active_at and spell.done:
        return "done"
    return "step"


def settle(spell: IdleSpell, freed: int, step: int, refaults: int,
           pressure: float | None) -> str:
    """After a step: why the spell should stop here ('' to go on)."""
    # Half of what the last step freed coming back means its processes use what was
    # pushed. Less is the small text an idle loop keeps re-reading (a shell's binary is
    # ~500 pages) while a full step drains what is cold: go on. Once only that text is
    # left, each step frees what the last one brought back (seen under TCG: ~2 MiB a
    # step, forever): that is "in use" too.
    in_use = max(REFAULT_PAGES, min(spell.last_freed or step, step) // PAGE // 2)
    if spell.refaults is not None and refaults - spell.refaults > in_use:
        return "its pages came back at once (in use)"
    if pressure is not None and pressure >= PRESSURE_PCT:
        return f"memory pressure {pressure:.1f} %"
    if freed < step // 8:
        return "nothing cold left"
    return ""


class IdleReclaimer:
    """See the module docstring. ``plan(rec, step)`` gives a sandbox's swap allowance;
    ``persist(rec)`` saves a record."""

    def __init__(self, idle_s: float | None, interval_s: float, step_bytes: int,
                 plan: Callable[[SandboxRecord, int], ReclaimPlan],
                 persist: Callable[[SandboxRecord], None]) -> None:
        self.idle_s, self.interval_s, self.step = idle_s, interval_s, step_bytes
        self._plan, self._persist = plan, persist
        self._spells: dict[str, IdleSpell] = {}
        self.in_flight: Callable[[str], bool] = lambda sb_id: False  # the node's requests
        self._task: asyncio.Task | None = None

    def start(self, records: Callable[[], Iterable[SandboxRecord]],
              backends: dict[str, Backend]) -> None:
        if any(b.can_reclaim for b in backends.values()):
            self._task = asyncio.get_running_loop().create_task(
                self._forever(records, backends))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _forever(self, records, backends) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.pass_once(list(records()), backends)
            except Exception:  # the loop must outlive any one bad sandbox
                log.exception("idle reclaim pass failed")

    async def pass_once(self, recs: list[SandboxRecord], backends: dict[str, Backend]) -> None:
        """One look at every sandbox: a step for each that is due one."""
        seen = set()
        for rec in recs:
            backend = backends.get(rec.spec.backend)
            if rec.state != "running" or backend is None or not backend.can_reclaim:
                continue
            seen.add(rec.id)
            idle_s = rec.spec.idle_reclaim_s if rec.spec.idle_reclaim_s is not None \
                else self.idle_s
            spell = self._spells.get(rec.id)
            if spell is not None and spell.since != rec.last_active_at:
                self._woke(rec)  # a request came: its next idle spell starts afresh
                spell = None
            if decide(time.time(), rec.last_active_at, idle_s, spell,
                      self.in_flight(rec.id)) != "step":
                continue
            if spell is None:
                spell = self._spells[rec.id] = IdleSpell(since=rec.last_active_at)
            await self._step(rec, backend, spell)
        for sb_id in set(self._spells) - seen:  # stopped or paused meanwhile
            del self._spells[sb_id]

    async def _step(self, rec: SandboxRecord, backend: Backend, spell: IdleSpell) -> None:
        since = spell.since
        base = self._plan(rec, self.step)
        plan = ReclaimPlan(base.swap_bytes, self.step, lambda: rec.last_active_at != since)
        try:
            res = await asyncio.to_thread(backend.reclaim_idle, rec, plan)
        except OSError as exc:  # stopped under it, most likely
            log.debug("idle reclaim of %s: %s", rec.id, exc)
            spell.done = str(exc)[:200]
            return
        if rec.last_active_at != since or rec.state != "running":
            return  # a request or a pause came meanwhile: this spell is over
        spell.freed += res.freed_bytes
        spell.swapped = res.swapped_bytes
        spell.done = settle(spell, res.freed_bytes, self.step, res.refaults, res.pressure)
        spell.refaults, spell.last_freed = res.refaults, res.freed_bytes
        rec.runtime[IDLE_KEY] = {"state": "idle reclaimed" if spell.done else "idle reclaiming",
                                 "freed": spell.freed, "swapped": spell.swapped,
                                 "note": spell.done or res.note}
        self._persist(rec)
        if spell.done and spell.freed:
            log.info("idle reclaim of %s: %d MiB freed, %d MiB in swap (%s)", rec.id,
                     spell.freed >> 20, spell.swapped >> 20, spell.done)

    def _woke(self, rec: SandboxRecord) -> None:
        self._spells.pop(rec.id, None)
        if rec.runtime.pop(IDLE_KEY, None) is not None:
            self._persist(rec)
