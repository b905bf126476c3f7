"""EROFS build (``mkfs.erofs``) and file-backed mounts through mount(2).

util-linux ``mount`` quietly attaches a loop device when the source is a regular file; the
kernel's EROFS file-backed mode needs none, so mount(2) is called directly with the blob
path as source. Fewer moving parts, no loop device limit, and the blob's page cache is
shared by every sandbox stacking the layer. Kernels before 6.12 (Debian 12's 6.1, the
cgroup-v2 test guest's) have no file-backed mode and answer ENOTBLK: there the blob goes
through a loop device that util-linux attaches with autoclear, so unmounting frees it.
"""

from __future__ import annotations

import ctypes
import errno
import os
import pathlib
import shutil
import subprocess

from dsec.api.errors import Internal

__all__ = ["mkfs", "mount_file", "mount_overlay", "umount", "is_mounted", "MKFS"]

MKFS = "mkfs.erofs"
MS_RDONLY = 1
MNT_DETACH = 2
# A fixed UUID and timestamp make a layer's digest a function of its content only.
_UUID = "00000000-0000-0000-0000-000000000000"

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


def mkfs(out: pathlib.Path, src: pathlib.Path, *, all_root: bool = False,
         fixed_time: bool = False) -> None:
    """Build an uncompressed EROFS image of directory ``src`` into file ``out``.

    Uncompressed so that reads map straight onto blob pages (shared page cache and
    on-demand chunk fetches stay simple). Ownership, modes, xattrs (overlay whiteout
    markers), device nodes and symlinks are kept.
    """
    if shutil.which(MKFS) is None:
        raise Internal(f"{MKFS} not found on PATH; install erofs-utils")
    cmd = [MKFS, "--quiet", "-U", _UUID]
    cmd.append("-T0" if fixed_time else "--preserve-mtime")
    if all_root:
        cmd.append("--all-root")
    cmd += [str(out), str(src)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise Internal(f"{MKFS} failed ({res.returncode}) for {src}: {res.stderr.strip()[-500:]}")


_directio = [True]  # cleared once a kernel refuses the option
_file_backed = [True]  # cleared once a kernel answers ENOTBLK (no file-backed EROFS)


def mount_file(blob: pathlib.Path, target: pathlib.Path) -> None:
    """Mount EROFS image ``blob`` read-only at ``target``, file-backed (no loop device).

    With ``directio`` (kernels from 6.13 on), EROFS reads its backing file with direct
    I/O, so a layer's data sits in the page cache once (EROFS's own) instead of twice
    (EROFS's and the blob file's): it halves the memory of the first sandbox.
    """
    if not _file_backed[0]:
        _mount_loop(blob, target)
        return
    rc = -1
    if _directio[0]:
        rc = _libc.mount(os.fsencode(blob), os.fsencode(target), b"erofs", MS_RDONLY,
                         b"directio")
        if rc != 0 and ctypes.get_errno() == errno.EINVAL:
            _directio[0] = False
    if rc != 0 and not _directio[0]:
        rc = _libc.mount(os.fsencode(blob), os.fsencode(target), b"erofs", MS_RDONLY, b"")
    if rc != 0:
        err = ctypes.get_errno()
        if err == errno.ENOTBLK:
            _file_backed[0] = False
            _mount_loop(blob, target)
            return
        raise Internal(f"mount erofs {blob} on {target} failed: {os.strerror(err)} "
                       f"(errno {err})")


def _mount_loop(blob: pathlib.Path, target: pathlib.Path) -> None:
    """The pre-6.12 way: a read-only loop device over the blob (detached on unmount)."""
    res = subprocess.run(["mount", "-t", "erofs", "-o", "ro,loop", str(blob), str(target)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        raise Internal(f"mount erofs {blob} on {target} through a loop device failed: "
                       f"{res.stderr.strip()[-300:]}; this kernel has no file-backed EROFS "
                       f"mounts (6.12+), so it needs the loop module")


def umount(target: pathlib.Path) -> None:
    """Unmount ``target``; lazily (detach) if sandboxes still use it. No-op if not mounted."""
    path = os.fsencode(target)
    if _libc.umount2(path, 0) == 0:
        return
    err = ctypes.get_errno()
    if err == errno.EBUSY and _libc.umount2(path, MNT_DETACH) == 0:
        return
    if err in (errno.EINVAL, errno.ENOENT):
        return
    raise Internal(f"umount {target} failed: {os.strerror(err)}")


def is_mounted(target: pathlib.Path) -> bool:
    """True if something is mounted at ``target``."""
    return os.path.ismount(target)


def mount_overlay(lowerdirs: list[pathlib.Path], upper: pathlib.Path, work: pathlib.Path,
                  target: pathlib.Path) -> None:
    """Mount a writable overlay (lowerdirs top-most first) whose upper dir can be packed.

    ``redirect_dir`` and ``metacopy`` are off so the upper dir is self-contained.
    """
    opts = (f"lowerdir={':'.join(map(str, lowerdirs))},upperdir={upper},workdir={work},"
            "redirect_dir=off,metacopy=off").encode()
    if _libc.mount(b"overlay", os.fsencode(target), b"overlay", 0, opts) != 0:
        err = ctypes.get_errno()
        raise Internal(f"mount overlay on {target} failed: {os.strerror(err)}")
