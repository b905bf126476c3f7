"""mount(2) and umount2(2) through libc, so a sandbox's mounts cost no process spawn.

util-linux ``mount`` would also quietly attach a loop device to a file source; calling the
syscall keeps EROFS file-backed mounts loop-free.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path

__all__ = ["mount", "umount", "is_mountpoint", "mounts_under", "superblocks", "MS_RDONLY",
           "MS_NOSUID", "MS_NODEV", "MS_REMOUNT", "MNT_DETACH"]

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_REMOUNT = 32
MNT_DETACH = 2

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


def mount(source: str | Path, target: str | Path, fstype: str, flags: int = 0,
          data: str = "") -> None:
    """Mount or raise OSError naming the target."""
    rc = _libc.mount(os.fsencode(source), os.fsencode(target), fstype.encode(), flags,
                     data.encode() if data else None)
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {fstype} on {target}: {os.strerror(err)}")


def umount(target: str | Path, flags: int = MNT_DETACH) -> bool:
    """Unmount; returns False when nothing was mounted there."""
    rc = _libc.umount2(os.fsencode(target), flags)
    if rc != 0:
        err = ctypes.get_errno()
        if err in (22, 2):  # EINVAL: not a mount point; ENOENT: gone already
            return False
        raise OSError(err, f"umount {target}: {os.strerror(err)}")
    return True


def _mountinfo_targets() -> list[str]:
    out = []
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            target = line.split(b" ")[4].decode("unicode_escape")
            out.append(target)
    return out


def is_mountpoint(path: str | Path) -> bool:
    return os.path.ismount(path)


def mounts_under(prefix: str | Path) -> list[str]:
    """Mount targets at or below ``prefix``, deepest first (the order to unmount them)."""
    p = str(Path(prefix).resolve())
    found = [t for t in _mountinfo_targets() if t == p or t.startswith(p + "/")]
    return sorted(set(found), key=lambda t: t.count("/"), reverse=True)


def superblocks(mountinfo: str) -> dict[str, tuple[str, str]]:
    """The distinct filesystems (superblocks) of a mount table, the text of a
    ``/proc/<pid>/mountinfo``: {major:minor: (first mount target, fs type)}. Binds share
    their source's superblock; every new one costs kernel memory per memory cgroup (see
    :mod:`dsec.node.host.oci`)."""
    out: dict[str, tuple[str, str]] = {}
    for line in mountinfo.splitlines():
        f = line.split(" ")
        if len(f) > 7 and "-" in f[6:]:
            out.setdefault(f[2], (f[4], f[f.index("-", 6) + 1]))
    return out
