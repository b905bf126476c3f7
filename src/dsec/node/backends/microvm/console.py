"""A guest's serial console: drained from QEMU's ring buffer into a size-capped file.

QEMU keeps the console in a fixed-size ring buffer, so a guest that floods its console
costs bounded memory and no disk. The node drains it when it looks (failures, OOM checks,
stop) and appends to ``console.log``; past ``cap`` bytes only the newest half is kept.
Guest OOM kills are counted while draining, in a file that survives the truncation.
"""

from __future__ import annotations

import base64
from pathlib import Path

from dsec.node.backends.microvm.qemu import CONSOLE_CHARDEV
from dsec.node.backends.microvm.qmp import QMPError, qmp_sync

__all__ = ["drain_console", "console_tail", "oom_count"]

OOM_MARK = b"Out of memory: Killed process"
DEFAULT_CAP = 1 << 20


def _append_capped(log: Path, data: bytes, cap: int) -> None:
    with open(log, "ab") as f:
        f.write(data)
        size = f.tell()
    if size > cap:
        keep = log.read_bytes()[-(cap // 2):]
        log.write_bytes(b"[... console truncated ...]\n" + keep)


def drain_console(workdir: Path, cap: int = DEFAULT_CAP) -> bytes:
    """Move whatever the guest printed since the last drain into ``console.log``."""
    try:
        (raw,) = qmp_sync(workdir / "qmp.sock", [(
            "ringbuf-read", {"device": CONSOLE_CHARDEV, "size": 1 << 20, "format": "base64"})],
            timeout=5.0)
    except QMPError:
        return b""
    data = base64.b64decode(raw)
    if data:
        # A mark split across two drains is still counted: the tail carried over is one
        # byte shorter than the mark, so no mark is ever counted twice.
        carry_file = workdir / "console.carry"
        carry = carry_file.read_bytes() if carry_file.exists() else b""
        joined = carry + data
        n = joined.count(OOM_MARK)
        if n:
            (workdir / "oom").write_text(str(oom_count(workdir) + n))
        carry_file.write_bytes(joined[-(len(OOM_MARK) - 1):])
        _append_capped(workdir / "console.log", data, cap)
    return data


def console_tail(workdir: Path, n: int = 2000) -> str:
    """The last ``n`` characters of the console (after draining what is pending)."""
    drain_console(workdir)
    try:
        return (workdir / "console.log").read_bytes()[-n:].decode(errors="replace")
    except OSError:
        return ""


def oom_count(workdir: Path) -> int:
    """OOM kills counted so far in this guest."""
    try:
        return int((workdir / "oom").read_text())
    except (OSError, ValueError):
        return 0
