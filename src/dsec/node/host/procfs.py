"""Small readers of /proc used by the node and its benchmarks."""

from __future__ import annotations

from pathlib import Path

__all__ = ["pss"]


def pss(pid: int) -> int:
    """Proportional set size of a process in bytes (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
