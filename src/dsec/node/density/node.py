"""The node's density machinery in one place: swap, reclaim, CPU classes, KSM, host figures.

:class:`NodeDensity` is what :class:`~dsec.node.service.NodeService` holds. The node calls
:meth:`~NodeDensity.paused` after a freeze, :meth:`~NodeDensity.resuming` before a thaw and
:meth:`~NodeDensity.stopping` before a stop, and :meth:`~NodeDensity.start_idle` once it has
its records (idle reclaim runs in the background from then on); the rest is read-only.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import Callable, Iterable

from dsec.node.backends.base import Backend, ReclaimPlan, SandboxRecord
from dsec.node.density import cpuclass, ksm
from dsec.node.density.config import DensityConfig
from dsec.node.density.idle import IDLE_KEY, IdleReclaimer
from dsec.node.density.pressure import HostFigures, HostSampler
from dsec.node.density.reclaimer import KEY, Reclaimer
from dsec.node.density.swap import SwapManager, SwapStatus
from dsec.node.host import cgroups
from dsec.node.host.sysctl import HostLimits, raise_nofile

__all__ = ["NodeDensity"]

log = logging.getLogger("dsec.node.density")


@functools.cache
def _host_sampler() -> HostSampler:
    """One sampler per process: the host is the same for every node agent in it (one in
    production; many simulated ones in the control-plane benchmark, which each sampled the
    host on nearly every create)."""
    return HostSampler(sandbox_cpu_ns=_sandbox_cpu_ns())


def _sandbox_cpu_ns() -> Callable[[], int | None] | None:
    """The CPU every sandbox used so far (their parent cgroup, ``/dsec``: containers and
    guests alike), or None where this process cannot read cgroups (not root)."""
    if os.geteuid() != 0:
        return None
    driver = cgroups.detect()
    return lambda: driver.cpu_usage_ns("/dsec")


class NodeDensity:
    """See the module docstring. ``persist(rec)`` saves a record in the node's store."""

    def __init__(self, config: DensityConfig, persist: Callable[[SandboxRecord], None],
                 swap: SwapManager | None = None, sampler: HostSampler | None = None) -> None:
        self.config = config
        self.swap = swap or SwapManager(config.swap)
        self.sampler = sampler or _host_sampler()
        self.reclaimer = Reclaimer(config.reclaim_parallel, persist)
        self.idle = IdleReclaimer(config.idle_reclaim_s, config.idle_reclaim_interval_s,
                                  config.idle_reclaim_step_mb << 20,
                                  lambda rec, _step: self.plan(rec), persist)
        self.core = cpuclass.core_scheduling()
        self.limits = HostLimits(config.sysctls)
        self.ksm_ok = False
        self._swap_status = SwapStatus()

    async def open(self, backends: dict[str, Backend]) -> None:
        """Raise host limits; set up swap (and KSM) when some backend can use them; as
        root only."""
        if os.geteuid() != 0:
            return
        raise_nofile()
        await asyncio.to_thread(self.limits.ensure)
        if self.config.reclaim_on_pause and any(b.can_reclaim for b in backends.values()):
            mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            self._swap_status = await asyncio.to_thread(self.swap.ensure, mem)
        if self.config.ksm and "container" in backends:
            self.ksm_ok = ksm.merge_supported() and ksm.enable()
            if not self.ksm_ok:
                log.info("ksm: containers are not merged (%s)", ksm.status().note or "off")
        log.info("cpu classes: %s", self.core.note)

    def start_idle(self, records: Callable[[], Iterable[SandboxRecord]],
                   backends: dict[str, Backend]) -> None:
        """Reclaim from idle running sandboxes in the background (as root, with swap)."""
        if os.geteuid() == 0 and self.swap.status().total:
            self.idle.start(records, backends)

    async def close(self, sandboxes_left: bool) -> None:
        await self.idle.close()
        await self.reclaimer.close()
        await asyncio.to_thread(self.swap.release, sandboxes_left)
        await asyncio.to_thread(self.limits.release, sandboxes_left)

    # ---- pause and resume ----
    def plan(self, rec: SandboxRecord) -> ReclaimPlan:
        """How much swap ``rec`` may fill: its memory_mb, and a share of the node's swap."""
        total = self.swap.status().total
        cap = int(total * self.config.swap.sandbox_fraction)
        page = os.sysconf("SC_PAGE_SIZE")  # the kernel keeps limits in pages
        return ReclaimPlan(swap_bytes=min(rec.spec.memory_mb << 20, cap) // page * page,
                           step_bytes=self.config.reclaim_step_mb << 20)

    def paused(self, rec: SandboxRecord, backend: Backend) -> None:
        """``rec`` was just frozen: reclaim it in the background."""
        if self.config.reclaim_on_pause and backend.can_reclaim:
            self.reclaimer.start(rec, backend, self.plan(rec))

    async def resuming(self, rec: SandboxRecord, backend: Backend) -> None:
        """``rec`` is about to thaw: cancel its reclaim, restore limits, read memory back."""
        try:
            await self.reclaimer.undo(rec, backend)
        except OSError as exc:  # thaw anyway: a sandbox with odd limits beats a stuck one
            log.warning("could not restore the limits of %s: %s", rec.id, exc)

    async def stopping(self, rec: SandboxRecord) -> None:
        await self.reclaimer.cancel(rec.id)

    # ---- figures ----
    @staticmethod
    def reclaim_info(rec: SandboxRecord) -> dict:
        """What SandboxInfo says about the sandbox's reclaim."""
        r = rec.runtime.get(KEY) or rec.runtime.get(IDLE_KEY)
        if not r:
            return {}
        out: dict = {"reclaim": r.get("state")}
        if r.get("note"):
            out["reclaim"] = f"{r['state']}: {r['note']}"
        if "freed" in r:
            out["memory_reclaimed_mb"] = round(r["freed"] / (1 << 20), 1)
            out["memory_swapped_mb"] = round(r["swapped"] / (1 << 20), 1)
        return out

    def host(self) -> HostFigures:
        """The host's figures, sampled at most every quarter second (a burst of creates
        asks on every one)."""
        return self.sampler.recent(0.25)

    def ksm_note(self) -> str:
        st = ksm.status()
        if not self.config.ksm:
            return "off (node config)"
        if not self.ksm_ok:
            return st.note or "off"
        return f"merging containers; {st.pages_sharing * 4096 >> 20} MiB saved"
