"""What the host really has left: the figures node admission and ``dsec nodes`` use.

Read from /proc (injectable for tests): MemAvailable and swap from ``meminfo``, cores busy
from ``stat`` (the difference since the previous sample, so the watcher's once-a-second
load call sees the last second or so), PSI from ``pressure/`` when the kernel has it. The
cores the sandboxes themselves keep busy come from their parent cgroup's CPU counter
(``sandbox_cpu_ns``): that, not the host's figure, is what admission's CPU guard asks,
since a burst of creates keeps the cores busy with the node's own work (runc) while the
sandboxes it made sit idle: a 10,000-sandbox fill was refused at 900 on the host figure.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HostFigures", "HostSampler", "meminfo", "psi"]


@dataclass(frozen=True)
class HostFigures:
    memory_available_mb: int
    swap_total_mb: int
    swap_free_mb: int
    cpu_used: float | None          # cores busy since the last sample; None on the first
    memory_pressure: float | None   # PSI memory full avg10 (%)
    memory_some: float | None       # PSI memory some avg10 (%)
    cpu_pressure: float | None      # PSI cpu some avg10 (%)
    sandbox_cpu_used: float | None = None  # cores the sandboxes keep busy, same window


def meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` in KiB by key."""
    out = {}
    for line in text.splitlines():
        k, _, v = line.partition(":")
        parts = v.split()
        if parts and parts[0].isdigit():
            out[k] = int(parts[0])
    return out


def psi(text: str, kind: str = "some") -> float | None:
    """``avg10`` of the ``some`` or ``full`` line of a PSI file."""
    for line in text.splitlines():
        if line.startswith(kind + " "):
            for word in line.split():
                if word.startswith("avg10="):
                    return float(word[6:])
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


class HostSampler:
    """Samples the host; keep one per node (it remembers the last CPU sample)."""

    def __init__(self, proc: Path = Path("/proc"), min_interval_s: float = 0.5,
                 sandbox_cpu_ns: Callable[[], int | None] | None = None) -> None:
        self.proc = proc
        self.min_interval_s = min_interval_s
        self.sandbox_cpu_ns = sandbox_cpu_ns
        self._cpu: tuple[float, int, int] | None = None  # (when, busy, total) jiffies
        self._used: float | None = None
        self._sb: tuple[float, int] | None = None  # (when, sandboxes' CPU ns)
        self._sb_used: float | None = None

    def _cpu_used(self) -> float | None:
        first = _read(self.proc / "stat").split("\n", 1)[0].split()
        if len(first) < 5 or first[0] != "cpu":
            return None
        ticks = [int(x) for x in first[1:]]
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
        total, now = sum(ticks[:8]), time.monotonic()
        prev = self._cpu
        if prev is None or now - prev[0] >= self.min_interval_s:
            if prev is not None and total > prev[2]:
                cores = len([ln for ln in _read(self.proc / "stat").splitlines()
                             if ln.startswith("cpu") and ln[3:4].isdigit()]) or 1
                self._used = cores * ((total - idle) - prev[1]) / (total - prev[2])
            self._cpu = (now, total - idle, total)
        return self._used

    def _sandbox_cpu_used(self) -> float | None:
        ns = self.sandbox_cpu_ns() if self.sandbox_cpu_ns else None
        if ns is None:
            return None
        now, prev = time.monotonic(), self._sb
        if prev is None or now - prev[0] >= self.min_interval_s:
            if prev is not None and now > prev[0]:
                self._sb_used = max(0, ns - prev[1]) / 1e9 / (now - prev[0])
            self._sb = (now, ns)
        return self._sb_used

    def sample(self) -> HostFigures:
        mem = meminfo(_read(self.proc / "meminfo"))
        mem_psi = _read(self.proc / "pressure" / "memory")
        return HostFigures(
            memory_available_mb=mem.get("MemAvailable", 0) >> 10,
            swap_total_mb=mem.get("SwapTotal", 0) >> 10,
            swap_free_mb=mem.get("SwapFree", 0) >> 10,
            cpu_used=self._cpu_used(),
            memory_pressure=psi(mem_psi, "full"), memory_some=psi(mem_psi, "some"),
            cpu_pressure=psi(_read(self.proc / "pressure" / "cpu"), "some"),
            sandbox_cpu_used=self._sandbox_cpu_used())
