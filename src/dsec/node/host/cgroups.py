"""Reading a sandbox's cgroup on cgroup v1 (incl. hybrid hosts) and v2.

runc creates, limits and removes the cgroups (it has its own v1 and v2 managers); the node
only reads counters from them and cleans up leftovers. :func:`detect` picks the driver from
what the host mounts, so the same code runs on a hybrid v1 host and a pure v2 host.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CgroupDriver", "CgroupV1", "CgroupV2", "detect", "ROOT"]

ROOT = Path("/sys/fs/cgroup")


def _read_kv(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        for line in path.read_text().splitlines():
            k, _, v = line.partition(" ")
            if v.strip().lstrip("-").isdigit():
                out[k] = int(v)
    except OSError:
        pass
    return out


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


@dataclass(frozen=True)
class CgroupDriver:
    """Where a sandbox's cgroup lives and how to read it; ``rel`` is the runc cgroupsPath."""

    version: int = 0

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
        return ROOT / controller / rel.lstrip("/")

    def oom_kills(self, rel: str) -> int:
        return _read_kv(self._dir("memory", rel) / "memory.oom_control").get("oom_kill", 0)

    def memory_bytes(self, rel: str) -> int:
        return _read_int(self._dir("memory", rel) / "memory.usage_in_bytes")

    def exists(self, rel: str) -> bool:
        return self._dir("memory", rel).is_dir()

    def remove(self, rel: str) -> None:
        # runc also makes the cgroup in the named (systemd) and, on hybrid hosts, the
        # unified hierarchy: remove it from every hierarchy mounted here.
        for hierarchy in ROOT.iterdir():
            if hierarchy.is_dir() and not hierarchy.is_symlink():
                _rmdir_tree(hierarchy / rel.lstrip("/"))

    def leftovers(self, rel: str) -> list[str]:
        """Hierarchies where the cgroup still exists (for tests and leak checks)."""
        return [h.name for h in ROOT.iterdir()
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


@dataclass(frozen=True)
class CgroupV2(CgroupDriver):
    version: int = 2

    def _dir(self, rel: str) -> Path:
        return ROOT / rel.lstrip("/")

    def oom_kills(self, rel: str) -> int:
        return _read_kv(self._dir(rel) / "memory.events").get("oom_kill", 0)

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


def detect() -> CgroupDriver:
    """v2 when /sys/fs/cgroup itself is the unified hierarchy, else v1 (hybrid included)."""
    if (ROOT / "cgroup.controllers").exists():
        return CgroupV2()
    return CgroupV1()
