"""Reading a resumed sandbox's swapped memory back before its processes need it.

``process_madvise(MADV_WILLNEED)`` over every mapping of each process: the kernel reads
swapped anonymous pages back into the swap cache and starts readahead of file pages, so the
first request after a resume takes minor faults instead of a swap-in per page. tmpfs files
nobody maps (a container's writable layer) come back when read.
"""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path

__all__ = ["prefetch", "mappings"]

SYS_PROCESS_MADVISE = 440  # x86_64 and aarch64 alike (the generic table)
MADV_WILLNEED = 3
_SKIP = ("[vvar]", "[vdso]", "[vsyscall]", "[vvar_vclock]")


class _IOVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_libc = ctypes.CDLL(None, use_errno=True)


def mappings(maps_text: str) -> list[tuple[int, int]]:
    """(start, length) of each mapping worth prefetching, from /proc/<pid>/maps text."""
    out = []
    for line in maps_text.splitlines():
        parts = line.split()
        if len(parts) < 5 or parts[-1] in _SKIP or "r" not in parts[1]:
            continue
        lo, _, hi = parts[0].partition("-")
        out.append((int(lo, 16), int(hi, 16) - int(lo, 16)))
    return out


def prefetch(pids: list[int], proc: Path = Path("/proc")) -> int:
    """Advise WILLNEED on the memory of ``pids``; returns the bytes advised."""
    total = 0
    for pid in pids:
        try:
            ranges = mappings((proc / str(pid) / "maps").read_text())
            fd = os.pidfd_open(pid)
        except OSError:
            continue  # gone meanwhile, or a kernel thread
        try:
            # One range per call: the kernel stops a batch at the first mapping it refuses
            # (a PFN map, a locked one), and a process has a few hundred at most.
            for r in ranges:
                total += _advise(fd, [r])
        finally:
            os.close(fd)
    return total


def _advise(fd: int, ranges: list[tuple[int, int]]) -> int:
    iov = (_IOVec * len(ranges))(*[_IOVec(a, n) for a, n in ranges])
    done = _libc.syscall(SYS_PROCESS_MADVISE, fd, iov, len(ranges), MADV_WILLNEED, 0)
    if done < 0 and ctypes.get_errno() not in (errno.EINVAL, errno.ESRCH, errno.ENOMEM):
        raise OSError(ctypes.get_errno(), "process_madvise")
    return max(done, 0)
