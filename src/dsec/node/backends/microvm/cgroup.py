"""Putting a guest's QEMU in a cgroup of its own: the sandbox's CPU quota, and a memory cap.

Containers get their cgroup from runc; a guest's QEMU is started by the node, so the node
creates ``/dsec/<id>`` itself (same place, so the node's cgroup readers and leftover checks
work unchanged) and moves QEMU, all threads, into it. The memory cap is loose (guest RAM
plus QEMU's own overhead): the guest kernel enforces ``memory_mb`` inside; the cap only
stops a runaway QEMU from taking the host with it.
"""

from __future__ import annotations

import time
from pathlib import Path

from dsec.node.host import cgroups

__all__ = ["confine", "release", "cgroup_rel", "QEMU_OVERHEAD_MB"]

# TCG's translated-code cache, device buffers, the kernel image: measured ~120 MiB here.
QEMU_OVERHEAD_MB = 384


def cgroup_rel(sb_id: str) -> str:
    """The sandbox's cgroup path, the same one the container backend uses."""
    return f"/dsec/{sb_id}"


def _enable_v2_controllers(rel: str) -> Path:
    """Create the v2 cgroup with cpu and memory delegated down to it."""
    root = cgroups.ROOT
    d = root
    for part in rel.strip("/").split("/"):
        control = d / "cgroup.subtree_control"
        have = control.read_text().split()
        want = [c for c in ("cpu", "memory") if c not in have]
        if want:
            control.write_text(" ".join(f"+{c}" for c in want))
        d = d / part
        d.mkdir(exist_ok=True)
    return d


def confine(pid: int, sb_id: str, cpu: float, memory_mb: int) -> None:
    """Move QEMU ``pid`` into the sandbox's cgroup with a CPU quota of ``cpu`` cores."""
    rel = cgroup_rel(sb_id)
    quota = max(1000, int(cpu * 100_000))
    mem = str((memory_mb + QEMU_OVERHEAD_MB) << 20)
    driver = cgroups.detect()
    if driver.version == 2:
        d = _enable_v2_controllers(rel)
        (d / "cpu.max").write_text(f"{quota} 100000")
        (d / "memory.max").write_text(mem)
        (d / "cgroup.procs").write_text(str(pid))
        return
    for controller in ("cpu", "memory"):
        d = cgroups.ROOT / controller / rel.lstrip("/")
        d.mkdir(parents=True, exist_ok=True)
        if controller == "cpu":
            (d / "cpu.cfs_period_us").write_text("100000")
            (d / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            (d / "memory.limit_in_bytes").write_text(mem)
        (d / "cgroup.procs").write_text(str(pid))


def release(sb_id: str, timeout_s: float = 10.0) -> None:
    """Remove the sandbox's cgroup once its QEMU has exited.

    A killed QEMU stays in the cgroup as a zombie until it is reaped (by the node, or by
    init for a QEMU from before a node restart), and a cgroup with a member cannot be
    removed: wait for that."""
    driver, rel = cgroups.detect(), cgroup_rel(sb_id)
    deadline = time.monotonic() + timeout_s
    while driver.exists(rel) and driver.procs(rel) and time.monotonic() < deadline:
        time.sleep(0.02)
    driver.remove(rel)
