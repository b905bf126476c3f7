"""Turning ``user`` ("root", "1000", "1000:1000", "nobody") into ids inside the sandbox."""

from __future__ import annotations

from collections.abc import Callable

from dsec.api.errors import InvalidArgument, NotFound
from dsec.api.limits import UID_MAX
from dsec.node.files import FileOps

__all__ = ["resolve_user"]


def _passwd(files: FileOps) -> dict[str, tuple[int, int]]:
    try:
        with files.open_read("/etc/passwd") as f:
            text = f.read(1 << 20).decode(errors="replace")
    except NotFound:
        return {}
    out = {}
    for line in text.splitlines():
        parts = line.split(":")
        if len(parts) >= 4 and _number(parts[2]) and _number(parts[3]) \
                and int(parts[2]) <= UID_MAX and int(parts[3]) <= UID_MAX:
            out[parts[0]] = (int(parts[2]), int(parts[3]))
    return out


def _number(s: str) -> bool:
    return s.isascii() and s.isdecimal()  # not "²" or "٣", which isdigit() also takes


def _id(what: str, s: str) -> int:
    n = int(s)
    if n > UID_MAX:  # the kernel's ids are 32 bits: a larger one would wrap (to root)
        raise InvalidArgument(f"{what} must be between 0 and {UID_MAX}; got {s}")
    return n


def resolve_user(files: Callable[[], FileOps], user: str) -> tuple[int, int]:
    """(uid, gid) for ``user``; names are looked up in the sandbox's own /etc/passwd,
    reached through ``files()`` (called only then: most execs run as root or a uid)."""
    if user in ("", "root", "0", "0:0"):
        return 0, 0
    uid_s, sep, gid_s = user.partition(":")
    if sep and not _number(gid_s):
        raise InvalidArgument(f"user's group must be a numeric gid; got {gid_s!r}")
    if _number(uid_s):
        uid = _id("uid", uid_s)
        return uid, _id("gid", gid_s) if sep else uid
    known = _passwd(files())
    if uid_s not in known:
        raise InvalidArgument(f"user {uid_s!r} is not in the sandbox's /etc/passwd; "
                              "use a known name or a numeric uid[:gid]")
    uid, gid = known[uid_s]
    return uid, _id("gid", gid_s) if sep else gid
