"""Putting a guest's QEMU in a cgroup of its own: CPU quota and class, a memory cap, and
the knobs density moves (swap allowance, freezer) the same as for a container.

Containers get their cgroup from runc; a guest's QEMU is started by the node, so the node
creates ``/dsec/<id>`` itself (same place, so the node's cgroup readers and leftover checks
work unchanged) and starts QEMU in it (:func:`join_argv`). The memory cap is loose (guest RAM
plus QEMU's own overhead): the guest kernel enforces ``memory_mb`` inside; the cap only
stops a runaway QEMU from taking the host with it. Swap is closed while it runs (as runc
does for containers): a paused or idle guest's reclaim opens its allowance.

The CPU class is the container's (:mod:`dsec.node.density.cpuclass`): the QEMU process,
every vCPU and I/O thread of it, is the sandbox. Best effort: ``cpu.idle=1`` (v1 also the
lowest ``cpu.shares``) and SCHED_IDLE on every thread QEMU has once it answers (its vCPU
threads are made before that; threads it starts later inherit the policy).
"""

from __future__ import annotations

import time
from pathlib import Path

from dsec.node.density import cpuclass
from dsec.node.host import cgroups

__all__ = ["prepare", "join_argv", "set_class", "release", "cgroup_rel", "memory_limit",
           "set_frozen", "QEMU_OVERHEAD_MB"]

# TCG's translated-code cache, device buffers, the kernel image: measured ~120 MiB here.
QEMU_OVERHEAD_MB = 384
# v1 hierarchies QEMU joins: cpuacct too where it is mounted apart (the node's CPU figures
# read it), freezer for the reclaim of a paused guest.
V1_CONTROLLERS = ("cpu", "cpuacct", "memory", "freezer")


def cgroup_rel(sb_id: str) -> str:
    """The sandbox's cgroup path, the same one the container backend uses."""
    return f"/dsec/{sb_id}"


def memory_limit(memory_mb: int) -> int:
    """The cgroup's memory cap for a guest of ``memory_mb``, in bytes."""
    return (memory_mb + QEMU_OVERHEAD_MB) << 20


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


def prepare(sb_id: str, cpu: float, memory_mb: int, cpu_class: str = "latency") -> list[Path]:
    """Create the sandbox's cgroup with a CPU quota of ``cpu`` cores, its memory cap and
    ``cpu_class``; returns the ``cgroup.procs`` files QEMU joins (:func:`join_argv`)."""
    rel = cgroup_rel(sb_id)
    quota = max(1000, int(cpu * 100_000))
    mem = memory_limit(memory_mb)
    driver = cgroups.detect()
    if driver.version == 2:
        d = _enable_v2_controllers(rel)
        (d / "cpu.max").write_text(f"{quota} 100000")
        (d / "memory.max").write_text(str(mem))
        driver.set_swap(rel, mem, 0)
        procs = [d / "cgroup.procs"]
    else:
        procs = []
        for controller in V1_CONTROLLERS:
            if not (cgroups.ROOT / controller).is_dir():
                continue
            d = cgroups.ROOT / controller / rel.lstrip("/")
            d.mkdir(parents=True, exist_ok=True)
            if controller == "cpu":
                (d / "cpu.cfs_period_us").write_text("100000")
                (d / "cpu.cfs_quota_us").write_text(str(quota))
            elif controller == "memory":
                (d / "memory.limit_in_bytes").write_text(str(mem))
                if (d / "memory.memsw.limit_in_bytes").exists():  # swap accounting on
                    driver.set_swap(rel, mem, 0)
            procs.append(d / "cgroup.procs")
    driver.set_cpu_idle(rel, cpu_class == "best_effort")
    return procs


def join_argv(procs: list[Path]) -> list[str]:
    """A command prefix that moves itself into the cgroup (every ``procs`` file) and then
    execs the rest: QEMU is in the sandbox's cgroup from its first page on. (Moved in
    later, what it allocated before, the guest kernel it loads into guest RAM among it,
    would stay charged to the node's cgroup, beyond the sandbox's limit and its reclaim:
    neither v1 nor v2 moves charges with a task.)"""
    script = 'IFS=:; for f in $0; do echo $$ > "$f" || exit 125; done; unset IFS; exec "$@"'
    return ["/bin/sh", "-c", script, ":".join(str(p) for p in procs)]


def set_class(pid: int, cpu_class: str) -> None:
    """Give every thread QEMU ``pid`` has now the class's policy (SCHED_IDLE for best
    effort); threads it starts later inherit it."""
    cpuclass.set_threads(pid, cpu_class)


def set_frozen(sb_id: str, frozen: bool) -> bool:
    """Freeze or thaw the guest's QEMU (every thread); False where its cgroup has no
    freezer (a guest started before QEMU joined the v1 freezer hierarchy)."""
    driver, rel = cgroups.detect(), cgroup_rel(sb_id)
    if driver.version == 1 and not (cgroups.ROOT / "freezer" / rel.lstrip("/")).is_dir():
        return False
    if driver.version == 2 and not driver.exists(rel):
        return False
    driver.set_frozen(rel, frozen)
    return True


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
