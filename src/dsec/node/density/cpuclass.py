"""CPU classes: latency-class sandboxes keep their cores; best-effort ones use what is left.

Best effort: the sandbox's cgroup gets ``cpu.idle=1`` (v2, and v1 kernels >= 5.15; v1 also
the lowest ``cpu.shares``) and its init runs SCHED_IDLE, inherited by everything it starts.
Latency class, where the kernel has core scheduling (``CONFIG_SCHED_CORE``) and the CPU
has SMT: the init gets a core-scheduling cookie of its own, so no other sandbox's thread
runs on its core's sibling. :func:`core_scheduling` says whether this host can.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

from dsec.node.host.cgroups import CgroupDriver

__all__ = ["CPU_CLASSES", "CoreScheduling", "apply", "core_scheduling", "set_threads"]

CPU_CLASSES = ("latency", "best_effort")
PR_SCHED_CORE = 62
PR_SCHED_CORE_GET, PR_SCHED_CORE_CREATE = 0, 1
PIDTYPE_TGID = 1


@dataclass(frozen=True)
class CoreScheduling:
    available: bool
    note: str


def core_scheduling(smt: Path = Path("/sys/devices/system/cpu/smt/active")) -> CoreScheduling:
    """Whether latency-class sandboxes can get cores of their own (and why not)."""
    libc = ctypes.CDLL(None, use_errno=True)
    cookie = ctypes.c_ulonglong(0)
    kernel = libc.prctl(PR_SCHED_CORE, PR_SCHED_CORE_GET, 0, 0, ctypes.byref(cookie)) == 0
    try:
        has_smt = smt.read_text().strip() == "1"
    except OSError:
        has_smt = False
    why = [w for w, missing in (("kernel without CONFIG_SCHED_CORE", not kernel),
                                ("CPU without SMT", not has_smt)) if missing]
    if why:
        return CoreScheduling(False, "core scheduling off: " + ", ".join(why))
    return CoreScheduling(True, "core scheduling on: latency sandboxes own their cores")


def apply(driver: CgroupDriver, rel: str, init_pid: int | None, cpu_class: str,
          core: CoreScheduling | None = None) -> None:
    """Put a started sandbox in ``cpu_class`` (its cgroup and its init, before it forks)."""
    driver.set_cpu_idle(rel, cpu_class == "best_effort")
    if init_pid is not None:
        set_threads(init_pid, cpu_class, core)


def set_threads(pid: int, cpu_class: str, core: CoreScheduling | None = None) -> None:
    """Every thread ``pid`` has now gets the class's policy (SCHED_IDLE for best effort);
    threads and children it makes later inherit it."""
    best_effort = cpu_class == "best_effort"
    policy = os.SCHED_IDLE if best_effort else os.SCHED_OTHER
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return
    for tid in tids:
        try:
            os.sched_setscheduler(tid, policy, os.sched_param(0))
        except ProcessLookupError:
            pass
    if not best_effort and core is not None and core.available:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SCHED_CORE, PR_SCHED_CORE_CREATE, pid, PIDTYPE_TGID, 0)
