"""Density under faults, on real runc containers and real cgroups: a full swap allowance, a
node without zram, a sandbox allocating while it is paused and reclaimed, resume and stop in
the middle of a reclaim, a best-effort fork bomb beside a latency-class sandbox.
(The node killed while its sandboxes are swapped out: ``test_density_restart.py``.)"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from functools import partial
from pathlib import Path

import pytest

from dsec.api.models import ExecRequest, SandboxSpec
from dsec.node.config import NodeConfig
from dsec.node.density import node as density_node
from dsec.node.density.config import DensityConfig, SwapConfig
from dsec.node.density.swap import SwapManager
from dsec.node.host.cgroups import detect
from dsec.node.service import NodeService
from tests.node.test_density import holding, intact, sh
from tests.support.density import reclaimed

MiB = 1 << 20


def oom_kills_on_host() -> int:
    for line in Path("/proc/vmstat").read_text().splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    raise AssertionError("this kernel keeps no oom_kill count in /proc/vmstat")


def alive(pid: int, sb_id: str) -> bool:
    """The sandbox's process ``pid`` still runs (a zombie nobody reaped yet does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        return state not in ("Z", "X") and sb_id in Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return False


def frozen(sb_id: str) -> bool:
    drv, rel = detect(), f"dsec/{sb_id}"
    if drv.version == 1:
        return (drv.root / "freezer" / rel / "freezer.state").read_text().strip() == "FROZEN"
    return (drv.root / rel / "cgroup.freeze").read_text().strip() == "1"


def swap_allowed(sb_id: str, memory: int) -> int:
    """Bytes of swap the sandbox's cgroup may use now."""
    drv, rel = detect(), f"dsec/{sb_id}"
    if drv.version == 1:
        return int((drv.root / "memory" / rel / "memory.memsw.limit_in_bytes").read_text()) \
            - memory
    raw = (drv.root / rel / "memory.swap.max").read_text().strip()
    return 1 << 62 if raw == "max" else int(raw)


def limits_as_running(sb_id: str, memory: int) -> None:
    """The limits a running sandbox has: memory as asked, no swap, not frozen."""
    drv = detect()
    assert not frozen(sb_id)
    assert swap_allowed(sb_id, memory) == 0
    assert drv.version == 2 or drv.memory_limit(f"/dsec/{sb_id}") == memory


async def open_node(tmp_path, **density) -> NodeService:
    cfg = NodeConfig(state_dir=tmp_path, backends=["container"],
                     density=DensityConfig(swap=SwapConfig(zram_mb=1024), **density))
    return await NodeService.open(cfg)


@pytest.fixture
async def node(tmp_path):
    svc = await open_node(tmp_path, reclaim_step_mb=16)
    yield svc
    await svc.close(stop_sandboxes=True)


# ---- swap full ----

async def test_a_full_swap_allowance_still_freezes_reports_what_stayed_and_kills_nothing(node):
    # The sandbox may fill 4 MiB of swap (not the host's swap: that is shared).
    node.density.config.swap.sandbox_fraction = 4 * MiB / node.density.swap.status().total
    sb_id, md5 = await holding(node)
    neighbour, neighbour_md5 = await holding(node)
    init = node.record(sb_id).runtime["init_pid"]
    kills = oom_kills_on_host()
    await node.pause(sb_id)
    assert frozen(sb_id)
    info = await reclaimed(node, sb_id)
    assert info.state == "paused" and frozen(sb_id)
    assert info.reclaim.startswith("partial") and "swap allowance (4 MiB) is full" in \
        info.reclaim, info
    assert info.memory_swapped_mb <= 4.5, info
    assert info.memory_used_mb > 60, info  # what could not go: 38 MiB shell + 32 MiB file
    assert oom_kills_on_host() == kills
    for i in (sb_id, neighbour):
        assert node.backends["container"].oom_kills(node.record(i)) == 0
    await intact(node, sb_id, md5, init)
    await intact(node, neighbour, neighbour_md5, node.record(neighbour).runtime["init_pid"])
    limits_as_running(sb_id, 256 * MiB)
    assert oom_kills_on_host() == kills


# ---- no zram ----

async def test_no_zram_module_is_logged_and_pause_still_freezes(tmp_path, monkeypatch, caplog):
    # A kernel without zram has no /sys/class/zram-control, and this node finds no swap at
    # all (an empty /proc/swaps): this host has both, so both are faked for the node.
    fake_sys, swaps = tmp_path / "sys", tmp_path / "swaps"
    fake_sys.mkdir()
    swaps.write_text("Filename\tType\tSize\tUsed\tPriority\n")
    monkeypatch.setattr(density_node, "SwapManager",
                        partial(SwapManager, sys=fake_sys, proc_swaps=swaps))
    caplog.set_level(logging.INFO, logger="dsec.node.density")
    svc = await open_node(tmp_path / "node", reclaim_step_mb=16)
    try:
        said = [r.getMessage() for r in caplog.records if "zram" in r.getMessage()]
        assert any("no zram here" in m and "kernel lacks the zram module" in m
                   for m in said), said
        sb_id, md5 = await holding(svc)
        init = svc.record(sb_id).runtime["init_pid"]
        await svc.pause(sb_id)
        assert frozen(sb_id)
        info = await reclaimed(svc, sb_id)
        assert info.state == "paused" and frozen(sb_id)
        assert swap_allowed(sb_id, 256 * MiB) == 0, info
        # The node's own steps swap nothing (they would push out the 40 MB the sandbox
        # holds). The host's real swap is still there, and the kernel's global reclaim
        # (kswapd, once a long run has filled memory with page cache) may move a few of
        # its pages there whatever the node does: hence not exactly 0.
        assert info.memory_swapped_mb < 4, info
        assert "no swap" in info.reclaim, info
        await intact(svc, sb_id, md5, init)
        limits_as_running(sb_id, 256 * MiB)
    finally:
        await svc.close(stop_sandboxes=True)


# ---- a sandbox that allocates while it is reclaimed ----

CHUNKS = 96
GROW = (f"i=0; while [ $i -lt {CHUNKS} ]; do head -c 1048576 /dev/zero | tr '\\0' z "
        ">> /root/grow; a=\"$a$(head -c 100000 /dev/zero | tr '\\0' x)\"; i=$((i+1)); "
        "echo $i > /tmp/i; done; echo ${#a} > /tmp/alen; md5sum /root/grow > /tmp/sum; mv /tmp/sum /tmp/done")


async def test_a_sandbox_allocating_when_paused_is_reclaimed_and_finishes_whole(node):
    info = await node.create(SandboxSpec(memory_mb=256, disk_mb=160))
    sb_id = info.id
    await node.exec(sb_id, ExecRequest(cmd=["sh", "-c", GROW], background=True))
    # Paused mid-way: its writer and its growing variable are frozen between two pages.
    await sh(node, sb_id, "while [ \"$(cat /tmp/i 2>/dev/null || echo 0)\" -lt 30 ]; do "
                          "sleep 0.05; done")
    await node.pause(sb_id)
    got = await reclaimed(node, sb_id)
    # its pages went while it was mid-allocation: all of them, down to the kernel's own.
    # (How much that is depends on where its file's pages were when it paused: in a CI
    # run under load they had mostly left already, 11.6 MiB held against 30+ usually.)
    assert got.reclaim == "reclaimed" and got.memory_used_mb <= 2, got
    assert got.memory_reclaimed_mb > 3, got
    assert node.backends["container"].oom_kills(node.record(sb_id)) == 0
    await node.resume(sb_id)
    out = await sh(node, sb_id, "while [ ! -f /tmp/done ]; do sleep 0.1; done; "
                                "cat /tmp/done /tmp/alen")
    want = hashlib.md5(b"z" * (CHUNKS * MiB)).hexdigest()
    assert out.split() == [want, "/root/grow", str(CHUNKS * 100000)], out
    assert node.backends["container"].oom_kills(node.record(sb_id)) == 0
    limits_as_running(sb_id, 256 * MiB)


# ---- resume or stop in the middle of a reclaim ----

@pytest.fixture
async def slow_node(tmp_path):
    """Reclaims in 1 MiB steps, so one is still under way when the test acts."""
    svc = await open_node(tmp_path, reclaim_step_mb=1)
    yield svc
    await svc.close(stop_sandboxes=True)


async def mid_reclaim(node) -> tuple[str, str, int]:
    """A sandbox holding memory, paused, once its reclaim has started and pushed some
    memory out (paused again if a reclaim ran to its end before the test saw it under
    way): its id, its data's md5 and its init's pid."""
    sb_id, md5 = await holding(node)
    init = node.record(sb_id).runtime["init_pid"]
    held = node.backends["container"].memory_bytes(node.record(sb_id))
    for _ in range(5):
        await node.pause(sb_id)
        for _ in range(3000):
            r = node.record(sb_id).runtime.get("reclaim") or {}
            if r.get("state") == "reclaiming" and \
                    node.backends["container"].memory_bytes(node.record(sb_id)) < held - 4 * MiB:
                return sb_id, md5, init
            if r.get("state") not in (None, "reclaiming"):
                break
            await asyncio.sleep(0.005)
        await node.resume(sb_id)
    raise AssertionError(f"no reclaim seen under way: {node.record(sb_id).runtime}")


async def test_resume_in_the_middle_of_a_reclaim_leaves_no_limit_nor_freeze(slow_node):
    node = slow_node
    sb_id, md5, init = await mid_reclaim(node)
    info = await node.resume(sb_id)
    assert info.state == "running" and node.density.reclaimer.busy() == 0
    assert "reclaim" not in node.record(sb_id).runtime and info.reclaim is None
    limits_as_running(sb_id, 256 * MiB)
    await intact(node, sb_id, md5, init)
    # paused again, the next reclaim runs to its end as usual
    await node.pause(sb_id)
    assert (await reclaimed(node, sb_id)).memory_swapped_mb > 30
    await intact(node, sb_id, md5, init)
    limits_as_running(sb_id, 256 * MiB)


async def test_stop_in_the_middle_of_a_reclaim_leaves_nothing(slow_node):
    node = slow_node
    sb_id, _, init = await mid_reclaim(node)
    await node.stop(sb_id)
    assert node.density.reclaimer.busy() == 0
    assert detect().leftovers(f"/dsec/{sb_id}") == []
    assert not alive(init, sb_id)
    assert not (node.config.state_dir / "runc" / sb_id).exists()
    assert not (node.config.state_dir / "sandboxes" / sb_id).exists()


# ---- best effort beside latency class ----

BOMB = "b() { b | b & }; b"
SPIN = "while :; do :; done"


async def test_a_best_effort_fork_bomb_and_spinners_leave_latency_its_cores(node):
    """Both sandboxes may use both cores; the best-effort one forks without end (up to its
    pids limit) and spins. While the latency one spins too, it gets the CPU: the other
    gets a small fraction of what it does (without classes they would share it evenly)."""
    drv, cores = detect(), 2
    lat = await node.create(SandboxSpec(memory_mb=128, cpu=cores))
    be = await node.create(SandboxSpec(memory_mb=128, cpu=cores, cpu_class="best_effort",
                                       pids=64))
    for _ in range(cores):
        await node.exec(be.id, ExecRequest(cmd=["sh", "-c", SPIN], background=True))
    await node.exec(be.id, ExecRequest(cmd=["sh", "-c", BOMB], background=True))
    for _ in range(cores):
        await node.exec(lat.id, ExecRequest(cmd=["sh", "-c", SPIN], background=True))
    # counted from once the bomb is at its pids limit: while it still forks, its new tasks
    # take CPU as they start (a CI run counted 43 ms of it against the latency one's 225)
    await asyncio.sleep(1.0)
    used = [drv.cpu_usage_ns(f"/dsec/{i}") for i in (lat.id, be.id)]
    # a latency-class command meanwhile runs to its end
    r = await node.exec(lat.id, ExecRequest(cmd=["sh", "-c", "i=0; while [ $i -lt 100000 ]; "
                                                               "do i=$((i+1)); done; echo $i"],
                                            timeout=120))
    assert r.exit_code == 0 and r.stdout.strip() == "100000", r
    lat_ns, be_ns = (drv.cpu_usage_ns(f"/dsec/{i}") - u for i, u in zip((lat.id, be.id), used))
    assert be_ns * 10 < lat_ns, (lat_ns, be_ns)
    await node.stop(be.id)  # a stop outruns the bomb
    assert detect().leftovers(f"/dsec/{be.id}") == []
