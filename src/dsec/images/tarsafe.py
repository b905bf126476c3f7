"""Extract an untrusted layer tar into a staging directory, safely.

Tar layers come from users; each entry is checked before anything is written:

- ``..`` components, absolute paths, entries reached through a symlink: rejected.
- hard links whose target is not an earlier entry of the same tar: rejected.
- symlinks whose *relative* target climbs above the layer root: rejected (absolute targets
  are normal in a rootfs and are only ever resolved inside the sandbox's root), also when
  it climbs out only through other symlinks of the layer (``a/up -> ..`` then
  ``a/out -> up/../../etc``): checked once the whole layer is extracted, so the order of
  the entries does not matter.
- device nodes: rejected. setuid/setgid bits: cleared unless ``keep_setuid``.
- more than ``max_bytes`` of file data or ``max_entries`` entries: rejected (tar bombs).

Every rejection is an :class:`InvalidArgument` naming the entry. Docker/OCI whiteouts are
converted to the overlay form as they are met: ``.wh.NAME`` becomes a char device 0/0 named
NAME, ``.wh..wh..opq`` marks its directory opaque.
"""

from __future__ import annotations

import os
import pathlib
import posixpath
import shutil
import stat
import tarfile
from typing import IO

from pydantic import BaseModel, ConfigDict, Field

from dsec.api.errors import InvalidArgument
from dsec.images.whiteout import make_whiteout, set_opaque

__all__ = ["TarLimits", "extract_layer"]

WH_PREFIX = ".wh."
WH_OPAQUE = ".wh..wh..opq"


class TarLimits(BaseModel):
    """Limits and policy for untrusted tar layers."""

    model_config = ConfigDict(extra="forbid")

    max_bytes: int = Field(32 << 30, gt=0, description="Most file bytes one layer may hold.")
    max_entries: int = Field(2_000_000, gt=0, description="Most entries one layer may hold.")
    keep_setuid: bool = Field(False, description="Keep setuid/setgid bits instead of clearing them.")


def _clean_name(name: str, entry: str | None = None) -> str:
    """'./a/b/' -> 'a/b'; raises for absolute or climbing names (naming ``entry``)."""
    what = f"tar entry {entry or name!r}: " + (f"link target {name!r}: " if entry else "")
    if name.startswith("/"):
        raise InvalidArgument(what + "absolute paths are not allowed in a layer")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise InvalidArgument(what + "'..' is not allowed in a layer path")
    return "/".join(parts)


def _check_parents(root: pathlib.Path, rel: str, name: str) -> None:
    """Refuse to write below a symlink (that would land outside ``root``)."""
    cur = root
    for part in rel.split("/")[:-1]:
        cur = cur / part
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode):
            raise InvalidArgument(f"tar entry {name!r}: goes through symlink "
                                  f"{str(cur.relative_to(root))!r}")
        if not stat.S_ISDIR(st.st_mode):
            raise InvalidArgument(f"tar entry {name!r}: parent {str(cur.relative_to(root))!r} "
                                  f"is not a directory")


def _remove(path: pathlib.Path) -> None:
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


class _Extractor:
    def __init__(self, root: pathlib.Path, limits: TarLimits) -> None:
        self.root, self.limits = root, limits
        self.total = self.entries = 0
        self.seen: set[str] = set()
        self.dirs: list[tuple[pathlib.Path, tarfile.TarInfo]] = []
        self.links: list[tuple[str, str]] = []  # (rel path, entry name) of relative symlinks

    def entry(self, tar: tarfile.TarFile, m: tarfile.TarInfo) -> None:
        self.entries += 1
        if self.entries > self.limits.max_entries:
            raise InvalidArgument(f"tar entry {m.name!r}: layer has more than "
                                  f"{self.limits.max_entries} entries")
        rel = _clean_name(m.name)
        if not rel:
            return  # the root directory itself
        _check_parents(self.root, rel, m.name)
        base = posixpath.basename(rel)
        parent = self.root / posixpath.dirname(rel)
        if base == WH_OPAQUE:
            parent.mkdir(parents=True, exist_ok=True)
            set_opaque(parent)
            return
        if base.startswith(WH_PREFIX):
            hidden = base[len(WH_PREFIX):]
            if hidden in ("", ".", "..") or hidden.startswith(WH_PREFIX):
                raise InvalidArgument(f"tar entry {m.name!r}: malformed whiteout")
            target = parent / hidden
            parent.mkdir(parents=True, exist_ok=True)
            if os.path.lexists(target):
                _remove(target)
            make_whiteout(target)
            return
        dest = self.root / rel
        parent.mkdir(parents=True, exist_ok=True)
        if os.path.lexists(dest) and not (m.isdir() and dest.is_dir()):
            _remove(dest)
        self._create(tar, m, rel, dest)
        self.seen.add(rel)

    def _create(self, tar: tarfile.TarFile, m: tarfile.TarInfo, rel: str,
                dest: pathlib.Path) -> None:
        if m.isdir():
            dest.mkdir(exist_ok=True)
            self.dirs.append((dest, m))
            return
        if m.issym():
            self._check_symlink(m, rel)
            os.symlink(m.linkname, dest)
            if not m.linkname.startswith("/"):
                self.links.append((rel, m.name))
            os.lchown(dest, m.uid, m.gid)
            return
        if m.islnk():
            target = _clean_name(m.linkname, m.name)
            ok = target in self.seen and os.path.lexists(self.root / target)
            if ok:
                _check_parents(self.root, target, m.name)
                ok = stat.S_ISREG(os.lstat(self.root / target).st_mode)
            if not ok:
                raise InvalidArgument(f"tar entry {m.name!r}: hard link to {m.linkname!r}, "
                                      f"which is not an earlier regular file of this layer")
            os.link(self.root / target, dest, follow_symlinks=False)
            return
        if m.isreg():
            self._write_file(tar, m, dest)
        elif m.isfifo():
            os.mkfifo(dest)
        else:
            raise InvalidArgument(f"tar entry {m.name!r}: device nodes and other special "
                                  f"files are not allowed in a layer")
        self._meta(dest, m)

    def _check_symlink(self, m: tarfile.TarInfo, rel: str) -> None:
        if m.linkname.startswith("/"):
            return
        depth = 0
        for part in (posixpath.dirname(rel) + "/" + m.linkname).split("/"):
            if part == "..":
                depth -= 1
            elif part not in ("", "."):
                depth += 1
            if depth < 0:
                raise InvalidArgument(f"tar entry {m.name!r}: symlink to {m.linkname!r} "
                                      f"points outside the layer")

    def _write_file(self, tar: tarfile.TarFile, m: tarfile.TarInfo, dest: pathlib.Path) -> None:
        self.total += m.size
        if self.total > self.limits.max_bytes:
            raise InvalidArgument(f"tar entry {m.name!r}: layer exceeds the limit of "
                                  f"{self.limits.max_bytes} bytes")
        src = tar.extractfile(m)
        with open(dest, "wb") as out:
            remaining = m.size
            while remaining > 0:
                chunk = src.read(min(remaining, 1 << 20))
                if not chunk:
                    raise InvalidArgument(f"tar entry {m.name!r}: truncated")
                out.write(chunk)
                remaining -= len(chunk)

    def _meta(self, dest: pathlib.Path, m: tarfile.TarInfo) -> None:
        mode = m.mode & 0o7777
        if not self.limits.keep_setuid:
            mode &= ~(stat.S_ISUID | stat.S_ISGID) if not m.isdir() else ~stat.S_ISUID
        os.chown(dest, m.uid, m.gid)
        os.chmod(dest, mode)
        os.utime(dest, (m.mtime, m.mtime))

    def finish(self) -> None:
        for rel, name in self.links:
            if _escapes(self.root, rel):
                raise InvalidArgument(
                    f"tar entry {name!r}: symlink to {os.readlink(self.root / rel)!r} leads "
                    f"outside the layer through other symlinks of the layer")
        for dest, m in reversed(self.dirs):
            self._meta(dest, m)


def _escapes(root: pathlib.Path, rel: str, max_hops: int = 40) -> bool:
    """True if following symlink ``rel`` inside ``root`` climbs above ``root``.

    An absolute target ends the walk: it is resolved inside the sandbox's root only.
    """
    cur: list[str] = []
    parts = posixpath.dirname(rel).split("/") + [".", posixpath.basename(rel)]
    hops = 0
    while parts:
        part = parts.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if not cur:
                return True
            cur.pop()
            continue
        cur.append(part)
        path = root.joinpath(*cur)
        try:
            st = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            continue  # beyond what the layer has: resolved lexically
        if stat.S_ISLNK(st.st_mode):
            hops += 1
            target = os.readlink(path)
            if hops > max_hops:
                return False  # a loop: the kernel gives up too (ELOOP), nothing escapes
            if target.startswith("/"):
                return False
            cur.pop()
            parts[:0] = target.split("/")
    return False


def extract_layer(fileobj: IO[bytes], root: pathlib.Path, limits: TarLimits | None = None) -> None:
    """Extract a (possibly compressed) layer tar from ``fileobj`` into directory ``root``."""
    ex = _Extractor(root, limits or TarLimits())
    try:
        with tarfile.open(fileobj=fileobj, mode="r|*") as tar:
            for m in tar:
                ex.entry(tar, m)
    except tarfile.TarError as exc:
        raise InvalidArgument(f"not a readable tar layer: {exc}") from exc
    ex.finish()
