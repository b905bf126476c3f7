"""Density on real QEMU guests (microvm, TCG here): CPU classes on QEMU's cgroup and
threads, pause with reclaim of QEMU's memory, an idle step on a running guest. The node is
a real NodeService with swap of its own; guests are TCG, so each test boots as few as it
can."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
import pytest_asyncio

from dsec.api.models import ExecRequest, SandboxSpec
from dsec.node.backends.base import ReclaimPlan
from dsec.node.backends.microvm import MicroVMConfig
from dsec.node.backends.microvm.cgroup import QEMU_OVERHEAD_MB
from dsec.node.config import NodeConfig
from dsec.node.density.config import DensityConfig, SwapConfig
from dsec.node.host.cgroups import detect
from dsec.node.service import NodeService
from tests.support.density import reclaimed

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(400)]

GUEST_DIR = Path(__file__).resolve().parents[2] / "build" / "guest"
SPIN = "while :; do :; done"
# 48 MiB of noise in the guest's tmpfs (/dev/shm): guest RAM, QEMU's anonymous memory on
# the host, no page like another (KSM merges none of it). Its checksum must be the same
# after the reclaim.
BLOB = ("head -c 50331648 /dev/urandom "
        "> /dev/shm/blob && md5sum /dev/shm/blob")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def node(tmp_path_factory):
    root = tmp_path_factory.mktemp("density-guests")
    cfg = NodeConfig(state_dir=root, backends=["microvm"],
                     guests=MicroVMConfig(guest_dir=GUEST_DIR),
                     density=DensityConfig(swap=SwapConfig(zram_mb=1024), reclaim_step_mb=16,
                                           idle_reclaim_s=0))
    svc = await NodeService.open(cfg)
    yield svc
    ids = [r.id for r in svc.records.values()]
    await svc.close(stop_sandboxes=True)
    left = [f"{i}: {detect().leftovers(f'/dsec/{i}')}" for i in ids
            if detect().leftovers(f"/dsec/{i}")]
    assert not left, left


async def sh(node, sb_id: str, cmd: str, timeout: float = 120) -> str:
    r = await node.exec(sb_id, ExecRequest(cmd=["sh", "-c", cmd], timeout=timeout))
    assert r.exit_code == 0, (r.stdout, r.stderr)
    return r.stdout.strip()


def memory_limit(memory_mb: int) -> int:
    """The memory cap of a guest's cgroup (guest RAM and QEMU's own overhead)."""
    return (memory_mb + QEMU_OVERHEAD_MB) << 20


def threads(sb_id: str) -> list[int]:
    """Every thread of every process in the sandbox's cgroup (QEMU's)."""
    out = []
    for pid in detect().procs(f"/dsec/{sb_id}"):
        try:
            out += [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            pass
    return out


def policy(tid: int) -> int:
    return int(Path(f"/proc/{tid}/stat").read_text().rpartition(")")[2].split()[38])


async def test_a_best_effort_guest_runs_sched_idle_and_gets_far_less_cpu(node):
    """Both guests spin their one vCPU on the same host core (pinned here, so the test
    needs no idle machine). The latency guest gets the core; the best-effort one a small
    fraction of what it gets (without classes they would share it evenly)."""
    drv = detect()
    be = await node.create(SandboxSpec(backend="microvm", memory_mb=128, cpu=1,
                                       cpu_class="best_effort"))
    lat = await node.create(SandboxSpec(backend="microvm", memory_mb=128, cpu=1))
    try:
        assert be.cpu_class == "best_effort" and lat.cpu_class == "latency"
        assert drv.cpu_idle(f"/dsec/{be.id}") and not drv.cpu_idle(f"/dsec/{lat.id}")
        if drv.version == 1:  # 2 written; with cpu.idle the kernel shows the idle weight
            assert int((drv.root / "cpu" / "dsec" / be.id / "cpu.shares").read_text()) <= 3
        be_tids, lat_tids = threads(be.id), threads(lat.id)
        assert len(be_tids) > 1 and len(lat_tids) > 1  # QEMU: main loop, vCPU, workers
        assert {policy(t) for t in be_tids} == {os.SCHED_IDLE}
        assert {policy(t) for t in lat_tids} == {os.SCHED_OTHER}
        for sb in (be, lat):
            await node.exec(sb.id, ExecRequest(cmd=["sh", "-c", SPIN], background=True))
        core = min(os.sched_getaffinity(0))
        for tid in threads(be.id) + threads(lat.id):
            os.sched_setaffinity(tid, {core})
        start = [drv.cpu_usage_ns(f"/dsec/{i}") for i in (lat.id, be.id)]
        assert start[0] > 0  # QEMU's CPU is counted in its cgroup (v1: cpuacct joined)
        deadline = time.monotonic() + 120
        while True:  # until the latency guest has had 3 s of the core
            lat_ns, be_ns = (drv.cpu_usage_ns(f"/dsec/{i}") - s
                             for i, s in zip((lat.id, be.id), start))
            if lat_ns >= 3e9 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.25)
        assert lat_ns >= 3e9, lat_ns
        assert be_ns * 10 < lat_ns, (lat_ns, be_ns)
    finally:
        await asyncio.gather(node.stop(be.id), node.stop(lat.id))


def swap_allowed(drv, rel: str, limit: int) -> int:
    """What the cgroup may hold in swap now (v1: memsw above the memory limit)."""
    if drv.version == 2:
        raw = (drv.root / rel.lstrip("/") / "memory.swap.max").read_text().strip()
        return 1 << 62 if raw == "max" else int(raw)
    memsw = drv.root / "memory" / rel.lstrip("/") / "memory.memsw.limit_in_bytes"
    return int(memsw.read_text()) - limit


async def test_pause_reclaims_a_guests_memory_and_every_byte_comes_back(node):
    drv = detect()
    info = await node.create(SandboxSpec(backend="microvm", memory_mb=256))
    rel, limit = f"/dsec/{info.id}", memory_limit(256)
    try:
        md5 = await sh(node, info.id, BLOB)
        await sh(node, info.id, "sleep 1000 >/dev/null 2>&1 & echo $! > /tmp/sleeper")
        held, used = drv.memory_bytes(rel), (await node.get(info.id)).memory_used_mb
        assert held > 48 << 20 and swap_allowed(drv, rel, limit) == 0  # no swap running
        await node.pause(info.id)
        done = await reclaimed(node, info.id, polls=1200)
        assert done.memory_reclaimed_mb >= 40, done
        assert done.memory_swapped_mb > 0
        # What SandboxInfo says its QEMU holds (Pss, file pages it shares with other
        # guests included), read after the reclaim ended
        assert (await node.get(info.id)).memory_used_mb < used - 40
        assert drv.memory_bytes(rel) < held - (40 << 20)
        assert drv.memory_limit(rel) == limit  # v1 steps put the limit back at their end
        # The next request resumes it: limits restored, memory read back, vCPUs go on.
        assert await sh(node, info.id, "md5sum /dev/shm/blob") == md5
        assert await sh(node, info.id, "kill -0 $(cat /tmp/sleeper) && echo alive") == "alive"
        back = await node.get(info.id)
        assert back.state == "running" and back.reclaim is None
        assert swap_allowed(drv, rel, limit) == 0 and drv.memory_limit(rel) == limit
    finally:
        await node.stop(info.id)


async def test_an_idle_step_pushes_a_running_guests_cold_pages_out(node):
    """One step of idle reclaim on a running guest (not frozen, not stopped): what it
    frees is QEMU's coldest memory, and the guest keeps answering with its data."""
    drv = detect()
    info = await node.create(SandboxSpec(backend="microvm", memory_mb=256))
    try:
        md5 = await sh(node, info.id, BLOB)
        backend, rec = node.backends["microvm"], node.record(info.id)
        plan = ReclaimPlan(swap_bytes=128 << 20, step_bytes=32 << 20)
        res = await asyncio.to_thread(backend.reclaim_idle, rec, plan)
        assert res.freed_bytes >= 16 << 20, res
        assert drv.memory_limit(f"/dsec/{info.id}") == memory_limit(256)
        assert await sh(node, info.id, "md5sum /dev/shm/blob") == md5
    finally:
        await node.stop(info.id)
