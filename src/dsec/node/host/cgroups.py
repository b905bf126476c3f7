"""Reading and steering a sandbox's cgroup on cgroup v1 (incl. hybrid hosts) and v2.

runc creates, limits and removes the cgroups (it has its own v1 and v2 managers); the node
reads counters from them, cleans up leftovers, and for density moves the memory and CPU
knobs runc set (swap allowance, limits to reclaim by, the CPU class). :func:`detect` picks
the driver from what the host mounts, so the same code runs on a hybrid v1 host and a pure
v2 host. The hierarchy's root is a field, so the drivers are tested against fake trees.
"""

from __future__ import annotations

import errno
import os
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CgroupDriver", "CgroupV1", "CgroupV2", "MemoryStat", "detect", "ROOT"]

ROOT = Path("/sys/fs/cgroup")


def _read_kv(path: Path | str) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open(path, "rb", buffering=0) as f:  # no text layer: read once per exec
            data = f.read()
    except OSError:
        return out
    for line in data.decode("ascii", "replace").splitlines():
        k, _, v = line.partition(" ")
        if v.strip().lstrip("-").isdigit():
            out[k] = int(v)
    return out


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


@dataclass(frozen=True)
class MemoryStat:
    """A cgroup's memory, in bytes, the same on v1 and v2."""

    anon: int = 0       # process memory (heap, stacks)
    file: int = 0       # page cache, shmem (tmpfs files) included
    shmem: int = 0      # tmpfs files and shared memory: swap-backed like anon
    swap: int = 0       # what sits in swap
    refaults: int = 0   # pages read back soon after being reclaimed (a busy cgroup's sign)


def _write(path: Path, value: str) -> bool:
    """Write a cgroup knob; False when the kernel refuses with EBUSY/EAGAIN (a limit it
    could not reclaim down to, a reclaim it could not finish)."""
    try:
        path.write_text(value)
        return True
    except OSError as exc:
        if exc.errno in (errno.EBUSY, errno.EAGAIN):
            return False
        raise


@dataclass(frozen=True)
class CgroupDriver:
    """Where a sandbox's cgroup lives and how to read it; ``rel`` is the runc cgroupsPath."""

    version: int = 0
    root: Path = ROOT

    def oom_kills(self, rel: str) -> int:
        raise NotImplementedError

    def memory_bytes(self, rel: str) -> int:
        raise NotImplementedError

    def exists(self, rel: str) -> bool:
        raise NotImplementedError

    def remove(self, rel: str) -> None:
        raise NotImplementedError

    def leftovers(self, rel: str) -> list[str]:
        raise NotImplementedError

    def procs(self, rel: str) -> list[int]:
        """Pids in the cgroup (and below); empty when it is gone."""
        raise NotImplementedError

    def set_limits(self, rel: str, cpu: float, memory_mb: int, pids: int) -> None:
        """Change CPU quota, memory (swap included) and pids limits of a running sandbox."""
        raise NotImplementedError

    def join_memory(self, rel: str, pid: int) -> None:
        """Move process ``pid`` into the cgroup, so the memory it charges from now on (the
        tmpfs pages it writes included) counts against the sandbox. On v1 only the memory
        hierarchy; on v2 the one cgroup, so the process also counts in its pids and CPU."""
        raise NotImplementedError

    def set_frozen(self, rel: str, frozen: bool) -> None:
        """Freeze or thaw every process of the cgroup, and wait until it took effect."""
        raise NotImplementedError

    # ---- density: memory ----
    def memory_stat(self, rel: str) -> MemoryStat:
        """The cgroup's memory by kind (its whole subtree)."""
        raise NotImplementedError

    def memory_limit(self, rel: str) -> int:
        """The memory limit now, in bytes (very large when unlimited)."""
        raise NotImplementedError

    def set_memory_limit(self, rel: str, limit: int) -> bool:
        """Set the memory limit (swap not included); False when the kernel could not push
        the cgroup's memory down to it (nothing more to reclaim, or swap is full)."""
        raise NotImplementedError

    def set_swap(self, rel: str, memory: int, swap: int) -> bool:
        """Let the cgroup hold up to ``swap`` bytes in swap besides ``memory`` in RAM;
        ``swap=0`` forbids swapping (runc's setting). False when refused as too low."""
        raise NotImplementedError

    def set_swappiness(self, rel: str, value: int) -> int | None:
        """v1: the cgroup's ``memory.swappiness`` (0: its own reclaim never swaps, page
        cache only); returns the value it had, None where there is no such knob (v2,
        whose ``memory.swap.max`` caps swap itself)."""
        return None

    def reclaim(self, rel: str, nbytes: int) -> bool:
        """Ask the kernel to push ``nbytes`` of the cgroup's memory out (v2
        ``memory.reclaim``); False when it could not. v1 has no such knob: lower the
        limit instead (:meth:`set_memory_limit`)."""
        raise NotImplementedError

    def memory_pressure(self, rel: str) -> float | None:
        """The cgroup's PSI ``some avg10`` for memory (% of time stalled), None if absent."""
        raise NotImplementedError

    def cpu_usage_ns(self, rel: str) -> int:
        """CPU time the cgroup's tasks used so far (0 where unreadable)."""
        raise NotImplementedError

    # ---- density: CPU ----
    def set_cpu_idle(self, rel: str, idle: bool) -> None:
        """Make the cgroup best-effort (``cpu.idle=1``: its tasks run SCHED_IDLE against
        its siblings) or latency class again. v1 also drops ``cpu.shares`` to the minimum."""
        raise NotImplementedError

    def cpu_idle(self, rel: str) -> bool:
        raise NotImplementedError

    def wait_frozen(self, read_state, want: str, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while read_state() != want:
            if time.monotonic() > deadline:
                raise TimeoutError(f"cgroup did not reach {want} in {timeout}s")
            time.sleep(0.001)


def _procs_under(path: Path, name: str) -> list[int]:
    out: list[int] = []
    for dirpath, _, files in os.walk(path):
        if name in files:
            try:
                out += [int(x) for x in Path(dirpath, name).read_text().split()]
            except OSError:
                pass
    return out


@dataclass(frozen=True)
class CgroupV1(CgroupDriver):
    version: int = 1

    def _dir(self, controller: str, rel: str) -> Path:
        return self.root / controller / rel.lstrip("/")

    def oom_kills(self, rel: str) -> int:
        # a string path: read before and after every exec, and Path joins cost more
        return _read_kv(f"{self.root}/memory/{rel.lstrip('/')}/memory.oom_control"
                        ).get("oom_kill", 0)

    def memory_bytes(self, rel: str) -> int:
        return _read_int(self._dir("memory", rel) / "memory.usage_in_bytes")

    def exists(self, rel: str) -> bool:
        return self._dir("memory", rel).is_dir()

    def remove(self, rel: str) -> None:
        # runc also makes the cgroup in the named (systemd) and, on hybrid hosts, the
        # unified hierarchy: remove it from every hierarchy mounted here.
        for hierarchy in self.root.iterdir():
            if hierarchy.is_dir() and not hierarchy.is_symlink():
                _rmdir_tree(hierarchy / rel.lstrip("/"))

    def leftovers(self, rel: str) -> list[str]:
        """Hierarchies where the cgroup still exists (for tests and leak checks)."""
        return [h.name for h in self.root.iterdir()
                if h.is_dir() and not h.is_symlink() and (h / rel.lstrip("/")).exists()]

    def procs(self, rel: str) -> list[int]:
        return _procs_under(self._dir("memory", rel), "cgroup.procs")

    def set_limits(self, rel: str, cpu: float, memory_mb: int, pids: int) -> None:
        mem = self._dir("memory", rel)
        new = str(memory_mb << 20)
        # memory+swap may never be below memory: raise memsw first, lower it last.
        if int(_read_int(mem / "memory.limit_in_bytes")) < memory_mb << 20:
            order = ("memory.memsw.limit_in_bytes", "memory.limit_in_bytes")
        else:
            order = ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes")
        for name in order:
            (mem / name).write_text(new)
        cpu_dir = self._dir("cpu", rel)
        (cpu_dir / "cpu.cfs_period_us").write_text("100000")
        (cpu_dir / "cpu.cfs_quota_us").write_text(str(max(1000, int(cpu * 100_000))))
        (self._dir("pids", rel) / "pids.max").write_text(str(pids))

    def join_memory(self, rel: str, pid: int) -> None:
        (self._dir("memory", rel) / "cgroup.procs").write_text(str(pid))

    def set_frozen(self, rel: str, frozen: bool) -> None:
        f = self._dir("freezer", rel) / "freezer.state"
        want = "FROZEN" if frozen else "THAWED"
        f.write_text(want)
        self.wait_frozen(lambda: f.read_text().strip(), want)

    def memory_stat(self, rel: str) -> MemoryStat:
        kv = _read_kv(self._dir("memory", rel) / "memory.stat")
        return MemoryStat(anon=kv.get("total_rss", 0), file=kv.get("total_cache", 0),
                          shmem=kv.get("total_shmem", 0), swap=kv.get("total_swap", 0),
                          refaults=kv.get("total_workingset_refault_anon", 0)
                          + kv.get("total_workingset_refault_file", 0))

    def memory_limit(self, rel: str) -> int:
        return _read_int(self._dir("memory", rel) / "memory.limit_in_bytes")

    def set_memory_limit(self, rel: str, limit: int) -> bool:
        # Lowering limit_in_bytes below usage makes the writer reclaim (swap included when
        # memsw allows it) until it fits, or fail with EBUSY after the kernel's retries.
        return _write(self._dir("memory", rel) / "memory.limit_in_bytes", str(limit))

    def set_swap(self, rel: str, memory: int, swap: int) -> bool:
        # v1 has no swap knob: memsw is memory + swap together, never below memory.
        return _write(self._dir("memory", rel) / "memory.memsw.limit_in_bytes",
                      str(memory + swap))

    def set_swappiness(self, rel: str, value: int) -> int | None:
        f = self._dir("memory", rel) / "memory.swappiness"
        try:
            old = int(f.read_text())
            f.write_text(str(value))
        except (OSError, ValueError):
            return None
        return old

    def reclaim(self, rel: str, nbytes: int) -> bool:
        raise NotImplementedError("cgroup v1 has no memory.reclaim; lower the limit")

    def memory_pressure(self, rel: str) -> float | None:
        return None  # v1 keeps no PSI per cgroup

    def cpu_usage_ns(self, rel: str) -> int:
        return _read_int(self._dir("cpuacct", rel) / "cpuacct.usage")

    def set_cpu_idle(self, rel: str, idle: bool) -> None:
        d = self._dir("cpu", rel)
        has_idle = (d / "cpu.idle").exists()  # v1 has it too since 5.15
        if has_idle and _read_int(d / "cpu.idle") == 1:
            # The kernel refuses cpu.shares (EINVAL) while the group is idle: a cgroup made
            # best-effort before (a guest's QEMU restored from disk into it) is left as it
            # is, or leaves idle first.
            if idle:
                return
            (d / "cpu.idle").write_text("0")
        (d / "cpu.shares").write_text("2" if idle else "1024")  # 2: the kernel's minimum
        if has_idle:
            (d / "cpu.idle").write_text("1" if idle else "0")

    def cpu_idle(self, rel: str) -> bool:
        d = self._dir("cpu", rel)
        if (d / "cpu.idle").exists():
            return _read_int(d / "cpu.idle") == 1
        return _read_int(d / "cpu.shares") == 2


@dataclass(frozen=True)
class CgroupV2(CgroupDriver):
    version: int = 2

    def _dir(self, rel: str) -> Path:
        return self.root / rel.lstrip("/")

    def oom_kills(self, rel: str) -> int:
        return _read_kv(f"{self.root}/{rel.lstrip('/')}/memory.events").get("oom_kill", 0)

    def memory_bytes(self, rel: str) -> int:
        return _read_int(self._dir(rel) / "memory.current")

    def exists(self, rel: str) -> bool:
        return self._dir(rel).is_dir()

    def remove(self, rel: str) -> None:
        _rmdir_tree(self._dir(rel))

    def leftovers(self, rel: str) -> list[str]:
        return ["unified"] if self._dir(rel).exists() else []

    def procs(self, rel: str) -> list[int]:
        return _procs_under(self._dir(rel), "cgroup.procs")

    def set_limits(self, rel: str, cpu: float, memory_mb: int, pids: int) -> None:
        d = self._dir(rel)
        (d / "memory.max").write_text(str(memory_mb << 20))
        if (d / "memory.swap.max").exists():
            (d / "memory.swap.max").write_text("0")
        (d / "cpu.max").write_text(f"{max(1000, int(cpu * 100_000))} 100000")
        (d / "pids.max").write_text(str(pids))

    def join_memory(self, rel: str, pid: int) -> None:
        (self._dir(rel) / "cgroup.procs").write_text(str(pid))

    def set_frozen(self, rel: str, frozen: bool) -> None:
        d = self._dir(rel)
        (d / "cgroup.freeze").write_text("1" if frozen else "0")
        want = "frozen 1" if frozen else "frozen 0"
        self.wait_frozen(lambda: next((ln for ln in (d / "cgroup.events").read_text()
                                       .splitlines() if ln.startswith("frozen")), ""), want)

    def memory_stat(self, rel: str) -> MemoryStat:
        d = self._dir(rel)
        kv = _read_kv(d / "memory.stat")
        return MemoryStat(anon=kv.get("anon", 0), file=kv.get("file", 0),
                          shmem=kv.get("shmem", 0), swap=_read_int(d / "memory.swap.current"),
                          refaults=kv.get("workingset_refault_anon", 0)
                          + kv.get("workingset_refault_file", 0))

    def memory_limit(self, rel: str) -> int:
        raw = _read_text(self._dir(rel) / "memory.max")
        return 1 << 62 if raw in ("max", "") else int(raw)

    def set_memory_limit(self, rel: str, limit: int) -> bool:
        d = self._dir(rel) / "memory.max"
        ok = _write(d, str(limit))
        # memory.max never fails: it reclaims, then OOM-kills what does not fit. Lowered
        # only to reclaim, so report a limit the cgroup did not get down to as refused.
        return ok and _read_int(self._dir(rel) / "memory.current") <= limit

    def set_swap(self, rel: str, memory: int, swap: int) -> bool:
        f = self._dir(rel) / "memory.swap.max"
        if not f.exists():  # a kernel without swap accounting: nothing to limit
            return swap == 0
        return _write(f, str(swap))

    def reclaim(self, rel: str, nbytes: int) -> bool:
        return _write(self._dir(rel) / "memory.reclaim", str(max(nbytes, 0)))

    def memory_pressure(self, rel: str) -> float | None:
        return _psi_some_avg10(self._dir(rel) / "memory.pressure")

    def cpu_usage_ns(self, rel: str) -> int:
        return _read_kv(self._dir(rel) / "cpu.stat").get("usage_usec", 0) * 1000

    def set_cpu_idle(self, rel: str, idle: bool) -> None:
        (self._dir(rel) / "cpu.idle").write_text("1" if idle else "0")

    def cpu_idle(self, rel: str) -> bool:
        return _read_int(self._dir(rel) / "cpu.idle") == 1


def _rmdir_tree(path: Path) -> None:
    """cgroup dirs are removed with rmdir, deepest first; files inside are not real files."""
    if not path.is_dir():
        return
    for dirpath, dirnames, _ in os.walk(path, topdown=False):
        for d in dirnames:
            try:
                os.rmdir(os.path.join(dirpath, d))
            except OSError:
                pass
    try:
        os.rmdir(path)
    except OSError:
        pass


def _read_text(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _psi_some_avg10(path: Path) -> float | None:
    """``some avg10=`` of a PSI file (``/proc/pressure/*``, a v2 cgroup's ``*.pressure``)."""
    for line in _read_text(path).splitlines():
        if line.startswith("some "):
            for word in line.split():
                if word.startswith("avg10="):
                    return float(word[6:])
    return None


def detect(root: Path = ROOT) -> CgroupDriver:
    """v2 when ``root`` itself is the unified hierarchy, else v1 (hybrid included)."""
    if (root / "cgroup.controllers").exists():
        return CgroupV2(root=root)
    return CgroupV1(root=root)
