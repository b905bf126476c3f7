"""KSM for container sandboxes: merging equal pages across them (and within one).

A container's init gets ``PR_SET_MEMORY_MERGE`` (Linux >= 6.4) from the process that starts
runc, and every process it starts inherits it (the flag survives fork and exec): all their
anonymous memory is offered to KSM. Guests get it from QEMU's ``madvise`` instead.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

__all__ = ["KsmStatus", "merge_supported", "enable", "status"]

PR_GET_MEMORY_MERGE = 68
KSM = Path("/sys/kernel/mm/ksm")


@dataclass(frozen=True)
class KsmStatus:
    supported: bool      # the kernel has per-process merging (PR_SET_MEMORY_MERGE)
    running: bool        # ksmd is scanning
    pages_sharing: int   # pages saved (mapped more than once, held once)
    note: str = ""


def merge_supported() -> bool:
    """Whether this kernel knows PR_SET_MEMORY_MERGE (asking our own setting tells)."""
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_GET_MEMORY_MERGE, 0, 0, 0, 0) >= 0


def enable(ksm: Path = KSM) -> bool:
    """Turn ksmd on; False when this host has no KSM or denies it."""
    try:
        run = ksm / "run"
        if run.read_text().strip() != "1":
            run.write_text("1")
        return True
    except OSError:
        return False


def status(ksm: Path = KSM) -> KsmStatus:
    supported = merge_supported()
    try:
        running = (ksm / "run").read_text().strip() == "1"
        sharing = int((ksm / "pages_sharing").read_text())
    except (OSError, ValueError):
        return KsmStatus(supported, False, 0, "no KSM on this kernel")
    note = "" if supported else "kernel < 6.4: containers are not merged (guests are)"
    return KsmStatus(supported, running, sharing, note)
