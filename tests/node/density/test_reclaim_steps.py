"""The reclaim steps against a modelled kernel (pure: the v1 limit write that reclaims and
refuses, the v2 memory.reclaim that gives up), so every branch runs on any host."""

from __future__ import annotations

from dataclasses import dataclass, field

from dsec.node.backends.base import ReclaimPlan
from dsec.node.density.reclaim import reclaim_cgroup, restore_cgroup
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
        out = min(need, self.swappable, self.allowance - self.swapped)
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


def test_a_full_swap_allowance_is_named():
    k = Kernel(pinned=0)
    r = reclaim_cgroup(k, "/x", 256 * MiB, plan(swap=10 * MiB))
    assert r.swapped_bytes == 10 * MiB and not r.complete
    assert "swap allowance (10 MiB) is full" in r.note


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
    assert restore_cgroup(k, "/x", 256 * MiB)
    assert k.limit == 256 * MiB and k.writes[-1] == ("swap", 0)
