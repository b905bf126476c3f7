"""Pushing a frozen cgroup's memory out, and undoing it: the same steps on v1 and v2.

v2: allow swap (``memory.swap.max``), then ask ``memory.reclaim`` for a step at a time.
v1: raise ``memory.memsw.limit_in_bytes`` by the swap allowance, then lower
``memory.limit_in_bytes`` a step at a time (no step larger than the allowance has room for:
memsw caps memory + swap, never swap alone) (the writing thread reclaims, swapping anon and
tmpfs pages, dropping page cache) until the kernel refuses, then restore the limit at once
(frozen tasks cannot grow back). Undo: forbid swap again (memory + swap may hold what it
held) and read back what was swapped (:mod:`.prefetch`). A step is the most a resume that
arrives mid-reclaim waits for.
"""

from __future__ import annotations

import time
from pathlib import Path

from dsec.node.backends.base import Reclaim, ReclaimPlan
from dsec.node.host.cgroups import CgroupDriver

__all__ = ["reclaim_cgroup", "reclaim_running", "restore_cgroup", "FLOOR"]

FLOOR = 1 << 20    # below this a cgroup holds only kernel memory: not worth a step
MIN_STEP = 1 << 20


def reclaim_cgroup(driver: CgroupDriver, rel: str, memory_limit: int,
                   plan: ReclaimPlan) -> Reclaim:
    """Reclaim a frozen cgroup whose memory limit (while running) is ``memory_limit``."""
    before = driver.memory_bytes(rel)
    if not driver.set_swap(rel, memory_limit, plan.swap_bytes):
        note = "the kernel refused the swap allowance; page cache only"
    else:
        note = ""
    if driver.version == 2:
        stopped = _steps_v2(driver, rel, plan)
    else:
        stopped = _steps_v1(driver, rel, memory_limit, plan)
    after, swapped = driver.memory_bytes(rel), driver.memory_stat(rel).swap
    if stopped == "stuck":
        stopped = _why_stuck(swapped, plan.swap_bytes)
    return Reclaim(before_bytes=before, after_bytes=after, swapped_bytes=swapped,
                   complete=stopped == "", note="; ".join(x for x in (note, stopped) if x))


def _steps_v2(driver: CgroupDriver, rel: str, plan: ReclaimPlan) -> str:
    while True:
        if plan.cancelled():
            return "cancelled"
        cur = driver.memory_bytes(rel)
        if cur <= FLOOR:
            return ""
        ask = min(plan.step_bytes, cur - FLOOR)
        if not driver.reclaim(rel, ask) and cur - driver.memory_bytes(rel) < ask // 8:
            return "stuck"  # a step that frees almost nothing: more would not either


def _steps_v1(driver: CgroupDriver, rel: str, memory_limit: int, plan: ReclaimPlan) -> str:
    step, misses = plan.step_bytes, 0
    closed: int | None = None  # the cgroup's swappiness, once swap is closed to it
    full = ""                  # why swap was closed
    try:
        while True:
            if plan.cancelled():
                return "cancelled"
            cur = driver.memory_bytes(rel)
            if cur <= FLOOR:
                return full
            # v1 caps memory + swap, and a page swapped out moves its charge from one to
            # the other: memsw never stops a swap-out. So no step asks for more than the
            # allowance has room for, and once it has none, swap is closed to the cgroup's
            # own reclaim (swappiness 0; page cache still goes).
            if not full:
                room = plan.swap_bytes - driver.memory_stat(rel).swap
                if room >= MIN_STEP:
                    step = min(step, room)
                else:
                    full = _full(plan.swap_bytes)
                    closed = driver.set_swappiness(rel, 0)
                    if closed is None:  # no such knob: stop before anything swaps more
                        return full
                    step = plan.step_bytes
            if driver.set_memory_limit(rel, max(FLOOR, cur - step)):
                misses = 0
                continue
            # Refused: the kernel gave up after its retries. Progress made meanwhile (or
            # a smaller step) may still go through; a few misses in a row at the smallest
            # step mean what is left cannot go (kernel memory, or swap is full).
            if cur - driver.memory_bytes(rel) >= MIN_STEP:
                continue
            if step > MIN_STEP:
                step = max(MIN_STEP, step // 4)
                continue
            misses += 1
            if misses >= 5:
                return full or "stuck"
            time.sleep(0.01)  # pages just written to swap are freed once their I/O ends
    finally:
        if closed is not None:  # before the limit: a crash leaves a lowered limit to see
            driver.set_swappiness(rel, closed)
        driver.set_memory_limit(rel, memory_limit)


def _full(allowance: int) -> str:
    if not allowance:
        return "the node has no swap; page cache only"
    return f"its swap allowance ({allowance >> 20} MiB) is full"


def reclaim_running(driver: CgroupDriver, rel: str, memory_limit: int,
                    plan: ReclaimPlan) -> Reclaim:
    """One step of reclaim on a running (not frozen) cgroup: its coldest pages go first.

    v2: ``memory.reclaim`` (proactive; never OOM-kills). v1: lower the limit by a step and
    put it back at once, so the sandbox's own allocations meet the lowered limit only for
    the length of one step. Swap is allowed up to ``plan.swap_bytes`` (and stays allowed:
    what went out comes back on demand)."""
    before = driver.memory_bytes(rel)
    note = "" if driver.set_swap(rel, memory_limit, plan.swap_bytes) else \
        "the kernel refused the swap allowance; page cache only"
    ask = min(plan.step_bytes, before - FLOOR)
    if driver.version == 1 and plan.swap_bytes:  # v1 does not cap swap: see _steps_v1
        room = plan.swap_bytes - driver.memory_stat(rel).swap
        if room < MIN_STEP:
            ask, note = 0, note or _full(plan.swap_bytes)
        ask = min(ask, room)
    if ask > 0 and not plan.cancelled():
        if driver.version == 2:
            driver.reclaim(rel, ask)
        else:
            try:
                driver.set_memory_limit(rel, before - ask)
            finally:
                driver.set_memory_limit(rel, memory_limit)
    after, stat = driver.memory_bytes(rel), driver.memory_stat(rel)
    return Reclaim(before_bytes=before, after_bytes=after, swapped_bytes=stat.swap,
                   complete=ask <= 0 or before - after < ask // 8, note=note,
                   refaults=stat.refaults, pressure=driver.memory_pressure(rel))


def _why_stuck(swapped: int, allowance: int) -> str:
    if allowance and swapped >= allowance - (1 << 20):
        return _full(allowance)
    return "the rest is not reclaimable now (kernel memory, or the node's swap is full)"


def restore_cgroup(driver: CgroupDriver, rel: str, memory_limit: int) -> bool:
    """Limits back as when running: memory as set, no swap. False if the kernel refused to
    forbid swap again (left allowed; the sandbox then may keep its swapped pages)."""
    if driver.version == 1 and driver.memory_limit(rel) != memory_limit:
        # a reclaim cut short by a node crash: it may have closed swap to the cgroup too
        driver.set_swappiness(rel, _host_swappiness())
        driver.set_memory_limit(rel, memory_limit)
    return driver.set_swap(rel, memory_limit, 0)


def _host_swappiness(path: Path = Path("/proc/sys/vm/swappiness")) -> int:
    """What a new cgroup starts with (v1 cgroups inherit the root's, which is this)."""
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return 60  # the kernel's default
