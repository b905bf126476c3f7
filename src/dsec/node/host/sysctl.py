"""Host limits a node raises so that it can hold as many sandboxes as admission allows.

A node with 10,000 idle sandboxes has at least 10,000 processes (each sandbox's agent),
and more while commands run; the kernel's default ``kernel.pid_max`` of 32,768 (pids and
threads of the whole host) is the first limit such a node meets. :class:`HostLimits`
raises each configured sysctl that is below its minimum (never lowers one), says so in
the log, and on close puts back only what it changed, only when no sandbox of the node is
left and only if nobody changed the value since. Several nodes in one process share the
change: it is put back when the last of them closes. The open-file soft limit of the
node's own process goes up to its hard limit (the node's sockets and pipes are per
request, not per sandbox, but a burst of creates holds several each).
"""

from __future__ import annotations

import logging
import resource
import threading
from pathlib import Path

__all__ = ["HostLimits", "raise_nofile"]

log = logging.getLogger("dsec.node.host")

_lock = threading.Lock()
_changed: dict[str, tuple[int, int]] = {}  # key -> (value before, value we wrote)
_holders = 0


def _path(root: Path, key: str) -> Path:
    return root / key.replace(".", "/")


def _read(root: Path, key: str) -> int | None:
    try:
        return int(_path(root, key).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


class HostLimits:
    """``minimum``: sysctl name (``kernel.pid_max``) -> the least value the node wants."""

    def __init__(self, minimum: dict[str, int], root: Path = Path("/proc/sys")) -> None:
        self.minimum = dict(minimum)
        self.root = root
        self._open = False

    def ensure(self) -> dict[str, tuple[int, int]]:
        """Raise what is below its minimum; returns ``{key: (before, now)}`` for each raised."""
        global _holders
        raised = {}
        with _lock:
            _holders += 1
            self._open = True
            for key, want in self.minimum.items():
                have = _read(self.root, key)
                if have is None:
                    log.info("sysctl %s: not on this kernel, left alone", key)
                    continue
                if have >= want:
                    continue
                try:
                    _path(self.root, key).write_text(f"{want}\n")
                except OSError as exc:
                    log.warning("sysctl %s is %d, under the %d this node wants, and could "
                                "not be raised: %s", key, have, want, exc)
                    continue
                _changed.setdefault(key, (have, want))
                raised[key] = (have, want)
                log.info("sysctl %s raised from %d to %d (put back when the node closes "
                         "with no sandbox left)", key, have, want)
        return raised

    def release(self, sandboxes_left: bool) -> dict[str, int]:
        """Put back what was raised, unless sandboxes are left or another node still runs;
        returns ``{key: value put back}``."""
        global _holders
        restored: dict[str, int] = {}
        with _lock:
            if not self._open:
                return restored
            self._open = False
            _holders -= 1
            if _holders > 0:
                return restored
            if sandboxes_left:  # their pids may need it: it stays, as after a crash
                _changed.clear()
                return restored
            for key, (before, wrote) in list(_changed.items()):
                now = _read(self.root, key)
                if now != wrote:  # someone changed it since: theirs now
                    log.info("sysctl %s is %s now, not the %d this node set: left", key,
                             now, wrote)
                else:
                    try:
                        _path(self.root, key).write_text(f"{before}\n")
                        restored[key] = before
                        log.info("sysctl %s put back to %d", key, before)
                    except OSError as exc:
                        log.warning("sysctl %s could not be put back to %d: %s", key,
                                    before, exc)
                del _changed[key]
        return restored


def raise_nofile() -> tuple[int, int]:
    """Raise this process's open-file soft limit to its hard limit; (before, now)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        log.info("open files: soft limit raised from %d to %d", soft, hard)
        return soft, hard
    return soft, soft
