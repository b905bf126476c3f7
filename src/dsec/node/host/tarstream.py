"""Tar in and out of a sandbox root, streamed, with hostile entries refused by name."""

from __future__ import annotations

import lzma
import os
import stat as st
import tarfile
import zlib
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, BinaryIO

from dsec.api.errors import InvalidArgument
from dsec.node.host.fdtree import Entry, walk
from dsec.node.host.rooted import KERNEL_FS

if TYPE_CHECKING:
    from dsec.node.host.rooted import RootedFiles

__all__ = ["tar_chunks", "untar_into", "check_member"]

CHUNK = 1 << 20
BLOCK = 512


def _pad(n: int) -> bytes:
    return b"\0" * ((BLOCK - n % BLOCK) % BLOCK)


def _entry(files: RootedFiles, e: Entry) -> Iterator[bytes]:
    s, dfd, name = e.stat, e.dfd, e.name
    ti = tarfile.TarInfo(e.path)
    ti.mode, ti.mtime, ti.uid, ti.gid = st.S_IMODE(s.st_mode), int(s.st_mtime), s.st_uid, s.st_gid
    if st.S_ISDIR(s.st_mode):
        ti.type = tarfile.DIRTYPE
        yield ti.tobuf(tarfile.PAX_FORMAT)
    elif st.S_ISLNK(s.st_mode):
        ti.type, ti.linkname = tarfile.SYMTYPE, os.readlink(name, dir_fd=dfd)
        yield ti.tobuf(tarfile.PAX_FORMAT)
    elif st.S_ISREG(s.st_mode):
        files.check_inode(s, e.path)  # a hard link to a protected file
        ti.size = s.st_size
        yield ti.tobuf(tarfile.PAX_FORMAT)
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
        sent = 0
        with os.fdopen(fd, "rb", buffering=0) as f:
            while sent < ti.size:
                chunk = f.read(min(CHUNK, ti.size - sent))
                if not chunk:
                    break
                sent += len(chunk)
                yield chunk
        yield b"\0" * (ti.size - sent)  # file shrank while we read: keep the archive valid
        yield _pad(ti.size)


def tar_chunks(files: RootedFiles, path: str) -> Iterator[bytes]:
    """Stream ``path`` as a tar whose top entry is its base name. A tar of ``/`` holds
    the sandbox's kernel and device filesystems (/proc, /sys, /dev) as empty directories:
    the root's own, which the sandbox never sees, are not its files."""
    if path == "/":
        parent, name = files.open_dir_fd("/"), "."
        prune = frozenset(f".{top}" for top in KERNEL_FS)
    else:
        parent, name = files.open_entry(path)
        prune = frozenset()
    try:
        # Iterative (fdtree), so a sandbox's thousands-deep directory does not end the
        # stream halfway; PAX headers carry names of any length.
        for e in walk(parent, name, prune=prune):
            yield from _entry(files, e)
    finally:
        os.close(parent)
    yield b"\0" * (BLOCK * 2)


def check_member(m: tarfile.TarInfo) -> str:
    """The safe relative name of a member, or InvalidArgument naming it."""
    name = m.name
    parts = PurePosixPath(name).parts
    if name.startswith("/") or ".." in parts:
        raise InvalidArgument(f"tar entry {name!r} escapes the target directory")
    if m.isdev() or m.isfifo():
        raise InvalidArgument(f"tar entry {name!r} is a device or fifo; not allowed")
    if m.islnk() and (m.linkname.startswith("/") or ".." in PurePosixPath(m.linkname).parts):
        raise InvalidArgument(f"tar entry {name!r} hard-links outside the archive")
    return "/".join(p for p in parts if p not in (".", ""))


def untar_into(files: RootedFiles, dest: str, stream: BinaryIO, max_bytes: int) -> int:
    """Unpack; regular files are written through rooted opens, setuid bits are dropped.
    A body that is not a whole tar (or tar.gz, .bz2, .xz) archive is InvalidArgument; the
    entries before the point where it broke stay unpacked."""
    try:
        return _untar(files, dest, stream, max_bytes)
    except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError) as exc:
        why = "the body is empty" if "empty file" in str(exc) else str(exc)
        raise InvalidArgument(f"the upload to {dest} is not a readable tar archive (plain, "
                              f"gzip, bzip2 or xz): {why}") from exc


def _untar(files: RootedFiles, dest: str, stream: BinaryIO, max_bytes: int) -> int:
    total = count = 0
    with tarfile.open(fileobj=stream, mode="r|*") as tf:
        for m in tf:
            rel = check_member(m)
            if not rel:
                continue
            total += max(m.size, 0)
            if total > max_bytes:
                raise InvalidArgument(
                    f"tar entry {m.name!r} takes the archive past its limit of {max_bytes} bytes")
            target = f"{dest.rstrip('/')}/{rel}"
            mode = m.mode & 0o777  # setuid, setgid and sticky bits are neutralised
            if m.isdir():
                files.mkdir(target)
            elif m.issym():
                files.mkdir(str(PurePosixPath(target).parent))
                try:
                    files.remove(target)
                except Exception:
                    pass
                files.symlink(m.linkname, target)
            elif m.islnk():
                src = files.open_read(f"{dest.rstrip('/')}/{m.linkname}")
                with src, files.open_write(target, mode) as out:
                    while chunk := src.read(CHUNK):
                        out.write(chunk)
            elif m.isfile():
                files.mkdir(str(PurePosixPath(target).parent))
                data = tf.extractfile(m)
                with files.open_write(target, mode) as out:
                    while data is not None and (chunk := data.read(CHUNK)):
                        out.write(chunk)
            count += 1
    return count
