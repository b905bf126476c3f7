"""Overlayfs deletion markers, the form every dsec layer stores them in.

A deleted path is a character device 0/0 (a *whiteout*); a directory whose lower contents
are hidden carries the xattr ``trusted.overlay.opaque=y``. Stacked as a lower layer, an
EROFS image holding these markers hides exactly what the packed sandbox had deleted.
"""

from __future__ import annotations

import errno
import os
import stat

__all__ = ["OPAQUE_XATTR", "make_whiteout", "is_whiteout", "set_opaque", "is_opaque",
           "OVERLAY_XATTR_PREFIX"]

OPAQUE_XATTR = "trusted.overlay.opaque"
OVERLAY_XATTR_PREFIX = "trusted.overlay."


def make_whiteout(path: str | os.PathLike) -> None:
    """Create a whiteout (char device 0/0) at ``path``."""
    os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(0, 0))


def is_whiteout(st: os.stat_result) -> bool:
    """True if ``st`` (from lstat) describes a whiteout."""
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def set_opaque(path: str | os.PathLike) -> None:
    """Mark directory ``path`` opaque (its lower contents are hidden)."""
    os.setxattr(path, OPAQUE_XATTR, b"y", follow_symlinks=False)


def is_opaque(path: str | os.PathLike) -> bool:
    """True if directory ``path`` is marked opaque."""
    try:
        return os.getxattr(path, OPAQUE_XATTR, follow_symlinks=False) == b"y"
    except OSError as exc:
        if exc.errno in (errno.ENODATA, errno.ENOTSUP):
            return False
        raise
