"""The reclaim steps against a modelled kernel (pure: the v1 limit write that reclaims and
refuses, the v2 memory.reclaim that gives up), so every branch runs on any host."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from dsec.node.backends.base import ReclaimPlan
from dsec.node.density.reclaim import reclaim_cgroup, reclaim_running, restore_cgroup
from dsec.node.host.cgroups import MemoryStat

MiB = 1 << 20


@dataclass
class Kernel:
    """One cgroup, a :class:`CgroupDriver` as reclaim sees it: ``swappable`` bytes go to
    swap (up to the allowance), ``cache`` bytes are dropped, ``pinned`` bytes never go."""

    version: int = 1
    swappable: int = 60 * MiB
    cache: int = 20 * MiB
    pinned: int = 2 * MiB
    limit: int = 256 * MiB
    allowance: int = 0
    swapped: int = 0
    swappiness: int = 60
    writes: list = field(default_factory=list)

    def memory_bytes(self, rel):
        return self.swappable + self.cache + self.pinned

    def memory_stat(self, rel):
        return MemoryStat(anon=self.swappable, file=self.cache, swap=self.swapped)

    def memory_limit(self, rel):
        return self.limit

    def _free(self, target):
        need = self.memory_bytes("") - target
        drop = min(need, self.cache)
        self.cache -= drop
        need -= drop
        # v2's memory.swap.max caps swap; v1's memsw caps memory + swap, which a swap-out
        # leaves as it was: nothing stops it but the node's own swap running out.
        # (v1's swappiness 0 keeps the cgroup's own reclaim off swap.)
        room = self.allowance - self.swapped if self.version == 2 else \
            self.swappable if self.swappiness else 0
        out = min(need, self.swappable, room)
        self.swappable -= out
        self.swapped += out
        return self.memory_bytes("") <= target

    def set_memory_limit(self, rel, limit):
        self.writes.append(("limit", limit))
        if limit >= self.memory_bytes(""):
            self.limit = limit
            return True
        ok = self._free(limit)
        if ok:
            self.limit = limit
        return ok

    def set_swap(self, rel, memory, swap):
        self.writes.append(("swap", swap))
        self.allowance = swap
        return True

    def set_swappiness(self, rel, value):
        self.writes.append(("swappiness", value))
        old, self.swappiness = self.swappiness, value
        return old

    def memory_pressure(self, rel):
        return None

    def reclaim(self, rel, nbytes):
        assert self.version == 2
        return self._free(self.memory_bytes("") - nbytes)


def plan(swap=256 * MiB, step=16 * MiB, cancelled=lambda: False):
    return ReclaimPlan(swap_bytes=swap, step_bytes=step, cancelled=cancelled)


def test_v1_lowers_the_limit_to_what_cannot_go_then_puts_it_back():
    k = Kernel()
    r = reclaim_cgroup(k, "/x", 256 * MiB, plan())
    assert r.freed_bytes == 80 * MiB and r.after_bytes == 2 * MiB
    assert r.swapped_bytes == 60 * MiB and not r.complete and "not reclaimable" in r.note
    assert k.limit == 256 * MiB  # restored at once
    assert k.writes[0] == ("swap", 256 * MiB)


def test_v1_everything_goes_when_nothing_is_pinned():
    k = Kernel(pinned=0)
    r = reclaim_cgroup(k, "/x", 256 * MiB, plan())
    assert r.complete and r.note == "" and r.after_bytes <= MiB


@pytest.mark.parametrize("version", [1, 2])
def test_a_full_swap_allowance_is_named_and_never_exceeded(version):
    k = Kernel(version=version, pinned=0)
    r = reclaim_cgroup(k, "/x", 256 * MiB, plan(swap=10 * MiB))
    assert r.swapped_bytes == 10 * MiB and not r.complete
    assert "swap allowance (10 MiB) is full" in r.note
    assert k.limit == 256 * MiB and k.swappiness == 60
    assert k.cache == 0  # with swap full, page cache still went


def test_v1_with_no_swap_drops_page_cache_and_swaps_nothing():
    k = Kernel()
    r = reclaim_cgroup(k, "/x", 256 * MiB, plan(swap=0))
    assert r.swapped_bytes == 0 and k.cache == 0 and k.swappable == 60 * MiB
    assert "no swap" in r.note and k.swappiness == 60


def test_v1_idle_steps_stop_at_the_swap_allowance():
    k = Kernel(cache=0, pinned=0)
    for _ in range(10):
        r = reclaim_running(k, "/x", 256 * MiB, plan(swap=20 * MiB, step=8 * MiB))
    assert r.swapped_bytes == 20 * MiB and r.freed_bytes == 0
    assert "swap allowance (20 MiB) is full" in r.note
    assert k.limit == 256 * MiB


def test_cancel_stops_before_the_next_step_and_restores():
    k = Kernel()
    steps = iter([False, False, True])
    r = reclaim_cgroup(k, "/x", 256 * MiB, plan(cancelled=lambda: next(steps)))
    assert r.note == "cancelled" and r.freed_bytes == 32 * MiB
    assert k.limit == 256 * MiB


def test_v2_asks_memory_reclaim_and_never_touches_the_limit():
    k = Kernel(version=2)
    r = reclaim_cgroup(k, "/x", 256 * MiB, plan())
    assert r.freed_bytes == 80 * MiB and not r.complete
    assert not [w for w in k.writes if w[0] == "limit"]


def test_restore_forbids_swap_again_and_fixes_a_lowered_limit():
    k = Kernel(limit=8 * MiB)  # a node died mid-reclaim
    k.swappiness = 0  # ... after closing swap to it
    assert restore_cgroup(k, "/x", 256 * MiB)
    assert k.limit == 256 * MiB and k.writes[-1] == ("swap", 0)
    assert k.swappiness == int(open("/proc/sys/vm/swappiness").read())
