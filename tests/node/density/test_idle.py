"""Idle reclaim's policy and its steps against the modelled kernel of test_reclaim_steps (pure:
no cgroup, no server); the real thing runs in tests/node/test_density.py."""

from __future__ import annotations

import time

from dsec.api.models import SandboxSpec
from dsec.node.backends.base import Backend, SandboxRecord
from dsec.node.density.idle import IDLE_KEY, IdleReclaimer, IdleSpell, decide, settle
from dsec.node.density.reclaim import FLOOR, reclaim_running
from tests.node.density.test_reclaim_steps import MiB, Kernel, plan


class RunningKernel(Kernel):
    refaults = 0
    pressure = None

    def memory_stat(self, rel):
        st = super().memory_stat(rel)
        return type(st)(anon=st.anon, file=st.file, swap=st.swap, refaults=self.refaults)

    def memory_pressure(self, rel):
        return self.pressure


def test_a_v1_step_lowers_the_limit_by_one_step_and_puts_it_back():
    k = RunningKernel()
    r = reclaim_running(k, "/x", 256 * MiB, plan(step=8 * MiB))
    assert r.freed_bytes == 8 * MiB and not r.complete
    assert k.limit == 256 * MiB and k.writes[0] == ("swap", 256 * MiB)
    assert [w for w in k.writes if w[0] == "limit"] == [("limit", 74 * MiB),
                                                        ("limit", 256 * MiB)]


def test_a_v2_step_asks_memory_reclaim_and_never_the_limit():
    k = RunningKernel(version=2)
    r = reclaim_running(k, "/x", 256 * MiB, plan(step=8 * MiB))
    assert r.freed_bytes == 8 * MiB
    assert not [w for w in k.writes if w[0] == "limit"]


def test_no_step_once_a_request_came():
    k = RunningKernel()
    r = reclaim_running(k, "/x", 256 * MiB, plan(cancelled=lambda: True))
    assert r.freed_bytes == 0 and not [w for w in k.writes if w[0] == "limit"]


def test_decide():
    now = 1000.0
    assert decide(now, now - 5, None, None) == "off"
    assert decide(now, now - 5, 0, None) == "off"
    assert decide(now, now - 5, 10, None) == "active"
    assert decide(now, now - 50, 10, None) == "step"
    assert decide(now, now - 50, 10, IdleSpell(since=now - 50, done="x")) == "done"
    # done for an earlier spell: a new one (it was used in between) starts again
    assert decide(now, now - 50, 10, IdleSpell(since=now - 90, done="x")) == "step"


def test_settle():
    s = IdleSpell(since=0, refaults=100)
    assert settle(s, 8 * MiB, 8 * MiB, 110, None) == ""
    assert settle(s, 8 * MiB, 8 * MiB, 100 + 600, None) == ""  # an idle loop's binary
    assert "in use" in settle(s, 8 * MiB, 8 * MiB, 100 + 1025, None)  # half the step
    assert "in use" in settle(s, 1 * MiB, 1 * MiB, 100 + 257, None)  # the floor
    s = IdleSpell(since=0, refaults=100, last_freed=MiB)
    assert settle(s, MiB, 8 * MiB, 100 + 250, None) == ""  # under the floor: noise
    assert "pressure" in settle(s, 8 * MiB, 8 * MiB, 100, 5.0)
    assert settle(s, 0, 8 * MiB, 100, None) == "nothing cold left"


class Modelled(Backend):
    name = "container"
    can_reclaim = True

    def __init__(self):
        self.kernels: dict[str, RunningKernel] = {}

    def reclaim_idle(self, rec, plan):
        return reclaim_running(self.kernels[rec.id], "/x", rec.spec.memory_mb << 20, plan)


def record(sb_id: str, last_active_at: float, idle_reclaim_s=None) -> SandboxRecord:
    return SandboxRecord(id=sb_id, spec=SandboxSpec(memory_mb=256,
                                                    idle_reclaim_s=idle_reclaim_s),
                         state="running", created_at=0, last_active_at=last_active_at)


async def test_idle_sandboxes_drain_step_by_step_and_active_ones_are_left_alone():
    backend = Modelled()
    now = time.time()
    idle, busy, never = (record("sb-idle", now - 60), record("sb-busy", now),
                         record("sb-never", now - 60, idle_reclaim_s=0))
    for r in (idle, busy, never):
        backend.kernels[r.id] = RunningKernel(pinned=0)
    saved = []
    reclaimer = IdleReclaimer(30.0, 1.0, 8 * MiB, lambda rec, step: plan(swap=256 * MiB),
                              saved.append)
    for _ in range(20):
        await reclaimer.pass_once([idle, busy, never], {"container": backend})
    info = idle.runtime[IDLE_KEY]
    assert info["state"] == "idle reclaimed" and info["note"] == "nothing cold left"
    left = backend.kernels["sb-idle"].memory_bytes("")
    assert left <= FLOOR and info["freed"] == 80 * MiB - left
    for r in (busy, never):
        assert IDLE_KEY not in r.runtime and backend.kernels[r.id].writes == []
    # a request: the figure goes, and a later idle spell starts again from there
    idle.last_active_at = time.time()
    await reclaimer.pass_once([idle, busy, never], {"container": backend})
    assert IDLE_KEY not in idle.runtime


async def _steps_around(disturb) -> tuple[SandboxRecord, int, int]:
    """One step, ``disturb(kernel)``, one more; then five passes. Returns the record and
    the limit steps taken before and after those five."""
    backend = Modelled()
    rec = record("sb-x", time.time() - 60)
    k = backend.kernels[rec.id] = RunningKernel(pinned=0)
    reclaimer = IdleReclaimer(30.0, 1.0, 8 * MiB, lambda rec, step: plan(), lambda r: None)
    await reclaimer.pass_once([rec], {"container": backend})
    disturb(k)
    await reclaimer.pass_once([rec], {"container": backend})
    steps = len([w for w in k.writes if w[0] == "limit"])
    for _ in range(5):
        await reclaimer.pass_once([rec], {"container": backend})
    return rec, steps, len([w for w in k.writes if w[0] == "limit"])


async def test_a_sandbox_whose_pages_come_back_is_left_alone():
    def came_back(k):  # what went out was read straight back: it is in use
        k.refaults += 2000
    rec, steps, later = await _steps_around(came_back)
    assert later == steps
    assert "in use" in rec.runtime[IDLE_KEY]["note"]


async def test_a_sandbox_stalled_on_memory_is_left_alone():
    def stalled(k):  # its tasks wait on memory (PSI): what went out is missed
        k.pressure = 2.5
    rec, steps, later = await _steps_around(stalled)
    assert later == steps == 4
    assert rec.runtime[IDLE_KEY]["note"] == "memory pressure 2.5 %"


def test_a_request_still_running_keeps_it_active():
    now = time.time()
    assert decide(now, now - 50, 10, None, in_flight=True) == "active"


def test_a_step_that_only_frees_what_came_back_ends_the_spell():
    # a full step drained what was cold; the shell's ~500 pages of text refault: go on
    s = IdleSpell(since=0, refaults=100, last_freed=8 * MiB)
    assert settle(s, 8 * MiB, 8 * MiB, 100 + 550, None) == ""
    # only that text is left: each step frees ~2 MiB and it comes straight back
    s = IdleSpell(since=0, refaults=100, last_freed=2 * MiB)
    assert "in use" in settle(s, 2 * MiB, 8 * MiB, 100 + 550, None)
