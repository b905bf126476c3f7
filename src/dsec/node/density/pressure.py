"""What the host really has left: the figures node admission and ``dsec nodes`` use.

Read from /proc (injectable for tests): MemAvailable and swap from ``meminfo``, cores busy
from ``stat`` (the difference since the previous sample, so the watcher's once-a-second
load call sees the last second or so), PSI from ``pressure/`` when the kernel has it. The
cores the sandboxes themselves keep busy come from their parent cgroup's CPU counter
(``sandbox_cpu_ns``): that, not the host's figure, is what admission's CPU guard asks,
since a burst of creates keeps the cores busy with the node's own work (runc) while the
sandboxes it made sit idle: a 10,000-sandbox fill was refused at 900 on the host figure.

Swap free is not memory free when the swap is zram: a page pushed there still costs its
compressed size in RAM. ``swap_gain_mb`` is what swap can still give back: a disk swap's
free space, and a zram's free space times the share compression saves (measured from its
``mm_stat``; nothing while it holds nothing, as incompressible data would save nothing).
Admission adds that, not ``swap_free_mb``, to MemAvailable: a 12 GiB zram would otherwise
let the node admit until RAM itself ran out.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HostFigures", "HostSampler", "meminfo", "psi", "swap_gain"]


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
    swap_gain_mb: int | None = None        # memory swap can still give back (see above)


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


def swap_gain(swaps: str, zram_mm_stat: Callable[[str], str]) -> int:
    """Bytes swap can still take off RAM: ``swaps`` is /proc/swaps, ``zram_mm_stat(name)``
    a zram device's mm_stat (orig_data_size compr_data_size mem_used_total ...)."""
    gain = 0
    for line in swaps.splitlines()[1:]:
        parts = line.split()
        if len(parts) < 4 or not parts[2].isdigit() or not parts[3].isdigit():
            continue
        free = (int(parts[2]) - int(parts[3])) << 10
        name = parts[0].rsplit("/", 1)[-1]
        if not name.startswith("zram"):
            gain += free
            continue
        stat = zram_mm_stat(name).split()
        if len(stat) >= 3 and stat[0].isdigit() and int(stat[0]) > 0:
            saved = max(0.0, 1.0 - int(stat[2]) / int(stat[0]))
            gain += int(free * saved)
    return gain


def _read(path: Path) -> str:
    """The file's text, or "" when it cannot be read. One open and plain reads: a load
    probe reads six of these, and Path.read_text cost three times as much per file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks).decode("utf-8", "replace")
    except OSError:
        return ""
    finally:
        os.close(fd)


class HostSampler:
    """Samples the host; keep one per node (it remembers the last CPU sample)."""

    def __init__(self, proc: Path = Path("/proc"), min_interval_s: float = 0.5,
                 sandbox_cpu_ns: Callable[[], int | None] | None = None,
                 sys: Path = Path("/sys")) -> None:
        self.proc = proc
        self.sys = sys
        self.min_interval_s = min_interval_s
        self.sandbox_cpu_ns = sandbox_cpu_ns
        self._cpu: tuple[float, int, int] | None = None  # (when, busy, total) jiffies
        self._used: float | None = None
        self._sb: tuple[float, int] | None = None  # (when, sandboxes' CPU ns)
        self._sb_used: float | None = None
        self._last: tuple[float, HostFigures] | None = None  # see recent

    def recent(self, max_age_s: float = 0.25) -> HostFigures:
        """The last sample while it is younger than ``max_age_s``, else a new one (a burst
        of creates, and every node agent of a process, ask on every one)."""
        now = time.monotonic()
        if self._last is None or now - self._last[0] >= max_age_s:
            self._last = (now, self.sample())
        return self._last[1]

    def _cpu_used(self) -> float | None:
        stat = _read(self.proc / "stat")
        first = stat.split("\n", 1)[0].split()
        if len(first) < 5 or first[0] != "cpu":
            return None
        ticks = [int(x) for x in first[1:]]
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
        total, now = sum(ticks[:8]), time.monotonic()
        prev = self._cpu
        if prev is None or now - prev[0] >= self.min_interval_s:
            if prev is not None and total > prev[2]:
                cores = len([ln for ln in stat.splitlines()
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
            sandbox_cpu_used=self._sandbox_cpu_used(),
            swap_gain_mb=swap_gain(_read(self.proc / "swaps"),
                                   lambda n: _read(self.sys / "block" / n / "mm_stat")) >> 20)
