"""Turning ``user`` ("root", "1000", "1000:1000", "nobody") into ids inside the sandbox."""

from __future__ import annotations

from dsec.api.errors import InvalidArgument, NotFound
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
        if len(parts) >= 4 and parts[2].isdigit() and parts[3].isdigit():
            out[parts[0]] = (int(parts[2]), int(parts[3]))
    return out


def resolve_user(files: FileOps, user: str) -> tuple[int, int]:
    """(uid, gid) for ``user``; names are looked up in the sandbox's own /etc/passwd."""
    if user in ("", "root", "0", "0:0"):
        return 0, 0
    uid_s, _, gid_s = user.partition(":")
    if uid_s.isdigit() and (not gid_s or gid_s.isdigit()):
        uid = int(uid_s)
        return uid, int(gid_s) if gid_s else uid
    known = _passwd(files)
    if uid_s not in known:
        raise InvalidArgument(f"user {uid_s!r} is not in the sandbox's /etc/passwd; "
                              "use a known name or a numeric uid[:gid]")
    uid, gid = known[uid_s]
    if gid_s:
        if not gid_s.isdigit():
            raise InvalidArgument(f"group must be numeric; got {gid_s!r}")
        gid = int(gid_s)
    return uid, gid
