"""Keeps the other sandboxes' mounts out of runc's sight (issue 12, 10,000 sandboxes).

runc 1.1 reads ``/proc/self/mountinfo`` several times per create, and every container
sandbox adds two mounts (its rw tmpfs and its overlay root) under ``<state>/sandboxes``:
in the host's namespace a create costs O(sandboxes) and a fill O(n²). So runc is started
by ``dsec-agent bundle`` (agent.c) in a mount namespace of its own, from which the whole
``<state>/sandboxes`` subtree is detached with one umount; that needs the directory to be a
mount of its own, which this module makes: a bind of the directory onto itself, private
(what is mounted under it propagates nowhere). A marker file beside it says dsec made it, so
a later node process (a restart, with sandboxes still running) also knows it may remove it.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from dsec.node.host import mounts

__all__ = ["OwnMount", "is_mount_target", "MS_BIND", "MS_REC", "MS_PRIVATE"]

MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000


def is_mount_target(path: str | Path, mountinfo: str) -> bool:
    """Whether ``path`` is where a mount of the table ``mountinfo`` (the text of a
    ``/proc/<pid>/mountinfo``) sits. ``os.path.ismount`` cannot tell a bind on the same
    filesystem from a plain directory."""
    want = os.fsencode(str(path))
    for line in mountinfo.splitlines():
        f = line.split(" ")
        if len(f) > 4 and _unescape(f[4]) == want:
            return True
    return False


def _mounts_below(path: str | Path, mountinfo: str) -> bool:
    prefix = os.fsencode(str(path)) + b"/"
    return any(_unescape(f[4]).startswith(prefix)
               for f in (line.split(" ") for line in mountinfo.splitlines()) if len(f) > 4)


def _unescape(field: str) -> bytes:
    # mountinfo writes space, tab, newline and backslash in paths as \ooo octal escapes
    raw, out, i = field.encode(), bytearray(), 0
    while i < len(raw):
        if raw[i] == 0x5C and i + 3 < len(raw) and raw[i + 1:i + 4].isdigit():
            out.append(int(raw[i + 1:i + 4], 8))
            i += 4
        else:
            out.append(raw[i])
            i += 1
    return bytes(out)


def _read_mountinfo() -> str:
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        return f.read()


class OwnMount:
    """``<state>/sandboxes`` as a private mount of its own, set up if missing.

    :meth:`ensure` is idempotent; :meth:`release` removes the bind only if dsec made it (the
    marker) and nothing is mounted under it any more (sandboxes left running keep it).
    """

    def __init__(self, directory: Path, marker: Path, read_mountinfo=_read_mountinfo) -> None:
        self.directory = Path(os.path.realpath(directory))
        self.marker = marker
        self._read_mountinfo = read_mountinfo

    def ensure(self) -> bool:
        """True when the directory is a mount of its own (made now, or already); False when
        it cannot be made one without hiding mounts already under it (sandboxes started by
        a node that did not make it: runc then keeps seeing them until they are gone)."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        table = self._read_mountinfo()
        if is_mount_target(self.directory, table):
            return True
        if _mounts_below(self.directory, table):
            return False
        mounts.mount(self.directory, self.directory, "", MS_BIND)
        try:
            mounts.mount("", self.directory, "", MS_PRIVATE)
            self.marker.write_text("dsec made this directory's self-bind mount\n")
        except BaseException:
            mounts.umount(self.directory)
            raise
        return True

    def ours(self) -> bool:
        return self.marker.exists()

    def release(self) -> bool:
        """Unmount the bind if dsec made it and nothing is mounted under it; True if done."""
        if not self.ours():
            return False
        if not is_mount_target(self.directory, self._read_mountinfo()):
            self.marker.unlink(missing_ok=True)
            return False
        try:
            mounts.umount(self.directory, 0)  # not lazy: EBUSY while sandboxes use it
        except OSError as exc:
            if exc.errno == errno.EBUSY:
                return False
            raise
        self.marker.unlink(missing_ok=True)
        return True
