"""Reaping sandbox inits: a stop returns once the sandbox's init is gone, not a zombie.

``runc run -d`` leaves the container's init an orphan: its parent exits, and the kernel
hands it to the nearest *child subreaper* above it, else to the host's init, which may
reap it seconds later (this machine's did; ``pgrep`` and ``/proc`` showed a zombie after
``stop`` returned). A node process that is a subreaper (:func:`hold_subreaper`) adopts the inits
of the containers it starts, so it can reap each one itself when it stops it
(:func:`wait_reaped`). An init it did not adopt (one started before a node restart) is
its parent's to reap: :func:`wait_reaped` waits, bounded, for that.

Only zombies that are a pid namespace's init are reaped on their own
(:func:`reap_adopted`): every process the node runs directly (runc, QEMU, helpers) lives
in the node's own pid namespace and is waited for by whoever started it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
from pathlib import Path

__all__ = ["hold_subreaper", "open_pidfd", "reap_adopted", "release_subreaper", "wait_reaped"]

PR_SET_CHILD_SUBREAPER = 36
_libc = ctypes.CDLL(None, use_errno=True)
_lock = threading.Lock()
_holders = 0


def hold_subreaper() -> None:
    """Make this process a child subreaper (``prctl``) while at least one holder (a
    container backend) needs it."""
    global _holders
    with _lock:
        if _holders == 0:
            _set(1)
        _holders += 1


def release_subreaper() -> None:
    """One holder is done. The last one reaps what was adopted and hands later orphans
    back to the host's init, so a test process that opened a node in process adopts
    nothing afterwards."""
    global _holders
    with _lock:
        _holders -= 1
        if _holders == 0:
            _set(0)
            reap_adopted()


def _set(on: int) -> None:
    if _libc.prctl(PR_SET_CHILD_SUBREAPER, on, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def open_pidfd(pid: int) -> int | None:
    """A pidfd of ``pid`` (it names that very process, whatever pid reuse comes later)."""
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def wait_reaped(pidfd: int, timeout_s: float = 5.0) -> bool:
    """Wait, at most ``timeout_s``, until the (killed) process behind ``pidfd`` is reaped:
    by this process when it is its child, else by its own parent. True once it is gone.
    Closes ``pidfd``."""
    deadline, delay = time.monotonic() + timeout_s, 0.0005
    ours = True
    try:
        while True:
            if ours:
                try:
                    if os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG) is not None:
                        return True  # ours, and reaped now
                except ChildProcessError:
                    ours = False  # not ours (or reaped already): its parent reaps it
            if not ours and _reaped(pidfd):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
    finally:
        os.close(pidfd)


def reap_adopted() -> int:
    """Reap the zombie children of this process that were a pid namespace's init (orphans
    it adopted as a subreaper); how many."""
    me, n = os.getpid(), 0
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            rest = (p / "stat").read_text().rsplit(")", 1)[1].split()
            if rest[0] != "Z" or int(rest[1]) != me or not _ns_init(p):
                continue
            os.waitpid(int(p.name), os.WNOHANG)
            n += 1
        except (OSError, ValueError, IndexError):
            continue
    return n


def _ns_init(p: Path) -> bool:
    """The process is pid 1 of a namespace below this one (``NSpid: <host> ... 1``)."""
    for line in (p / "status").read_text().splitlines():
        if line.startswith("NSpid:"):
            ids = line.split()[1:]
            return len(ids) > 1 and ids[-1] == "1"
    return False


def _reaped(pidfd: int) -> bool:
    """Signal 0 reaches a process until it is reaped (a zombie too), whatever took its pid
    since: ESRCH means reaped."""
    try:
        signal.pidfd_send_signal(pidfd, 0)
    except ProcessLookupError:
        return True
    return False
