"""File access inside a directory tree that can never leave it.

Every path is opened with ``openat2(RESOLVE_IN_ROOT)``: the kernel resolves ``..`` and
symlinks (absolute ones included) as if the tree were ``/``, so a sandbox's symlink to
``/etc/shadow`` lands on the sandbox's own ``/etc/shadow``, never the host's. Python has no
binding for openat2 yet, hence ctypes.

With ``protected`` paths (a sandbox's ``protected_paths``, for a caller other than the
grading identity) every opened file or directory is checked by where the kernel resolved
it, read back from ``/proc/self/fd``, so a symlink or ``..`` made by an agent command cannot
lead into one (:mod:`dsec.node.protected`), and every opened file that has other names is
checked by inode, so a hard link to a protected file leads nowhere either
(:mod:`dsec.node.host.hardlinks`). Writes open the file without truncating it, check it, and
only then reopen that same inode for writing: no window for a symlink swap.

The tree is the sandbox's root filesystem, not everything its processes see: its /proc,
/sys and /dev are the kernel's, mounted over empty directories of that tree. So every path
is refused (InvalidArgument) when the kernel resolved it, or its parent, to one of those
(``KERNEL_FS``): a write there would make an ordinary file in the writable layer that the
sandbox never sees, a read would answer from the wrong files. The one exception is
/dev/shm, a directory on the host (``shm``) bound into the sandbox: a path under it is
resolved in that directory as its root, and there without following symlinks (the sandbox
would follow one out of /dev/shm into its root, which that resolution cannot do faithfully).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import posixpath
import stat as st
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import BinaryIO

from dsec.api.errors import DSecError, Forbidden, InvalidArgument, NotFound, shorten
from dsec.api.models import FileInfo
from dsec.node import protected as prot
from dsec.node.host import fdtree, hardlinks
from dsec.node.host.charged import Charge, ChargedWriter

__all__ = ["RootedFiles", "openat2", "file_kind", "normalize_path", "KERNEL_FS", "SHM",
           "kernel_fs_refusal"]

KERNEL_FS = ("/proc", "/sys", "/dev")  # the kernel's, mounted over the root's empty dirs
SHM = "/dev/shm"  # the sandbox's tmpfs: a host directory, so reachable through the API

_SYS_OPENAT2 = 437
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_IN_ROOT = 0x10
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


def openat2(dirfd: int, path: str, flags: int, mode: int = 0, resolve: int = 0) -> int:
    how = _OpenHow(flags | os.O_CLOEXEC, mode, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | resolve)
    fd = _libc.syscall(_SYS_OPENAT2, dirfd, os.fsencode(path), ctypes.byref(how),
                       ctypes.sizeof(how))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return int(fd)


def file_kind(mode: int) -> str:
    """The API's name for a file type given ``st_mode``."""
    if st.S_ISREG(mode):
        return "file"
    if st.S_ISDIR(mode):
        return "dir"
    if st.S_ISLNK(mode):
        return "symlink"
    return "other"


def _info(path: str, s: os.stat_result) -> FileInfo:
    return FileInfo(path=path, name=PurePosixPath(path).name or "/", type=file_kind(s.st_mode),
                    size=s.st_size, mode=st.S_IMODE(s.st_mode), mtime=s.st_mtime)


def normalize_path(path: str) -> str:
    """An absolute, normalised sandbox path; empty or NUL-bearing paths are refused."""
    if not path or "\x00" in path:
        raise InvalidArgument(f"path must be a non-empty string without NUL; got {path!r}")
    return "/" + str(PurePosixPath("/", path)).lstrip("/")


def kernel_fs_refusal(asked: str, where: str) -> InvalidArgument:
    """The 400 for a path that is, or resolves to, ``where`` in /proc, /sys or /dev."""
    a, r = PurePosixPath(asked), PurePosixPath(where)
    via = "" if a == r or r in a.parents else f" (it resolves to {where})"
    return InvalidArgument(
        f"{shorten(asked)}{via} is on the sandbox's kernel or device filesystems "
        f"({', '.join(KERNEL_FS)}; only {SHM} is served): the files API reaches the "
        "sandbox's files, not those; use exec to read or write them")


class _Errors:
    """Turns OSError into the API's errors, naming the sandbox path."""

    def __init__(self, path: str) -> None:
        self.path = shorten(path)  # only ever shown

    def __enter__(self) -> None:
        return None

    def __exit__(self, et, exc, tb) -> bool:
        if isinstance(exc, OSError) and not isinstance(exc, DSecError):
            if exc.errno == errno.ENOENT:
                raise NotFound(f"no such file or directory in the sandbox: {self.path}") from exc
            if exc.errno == errno.ENOSPC:
                raise InvalidArgument(f"sandbox disk is full writing {self.path}") from exc
            if exc.errno == errno.ELOOP and prot.covering((SHM,), self.path):
                raise InvalidArgument(f"{self.path} goes through a symlink under {SHM}, "
                                      "which the files API does not follow there; name "
                                      "its target, or use exec") from exc
            if exc.errno == errno.ENOTEMPTY:  # only remove's rmdir meets it
                raise InvalidArgument(f"{self.path} is a directory that is not empty; pass "
                                      "recursive=True to remove it with its contents") from exc
            raise InvalidArgument(f"{self.path}: {exc.strerror}") from exc
        return False


class RootedFiles:
    """:class:`dsec.node.files.FileOps` over a host directory used as the sandbox root.

    With a ``charge``, file contents are written by a helper in the sandbox's memory cgroup
    (see :mod:`dsec.node.host.charged`): what the API writes counts against the sandbox.
    ``shm``: the host directory the sandbox sees as /dev/shm, if any (without one, /dev/shm
    is refused like the rest of /dev)."""

    def __init__(self, root: str, charge: Charge | None = None,
                 protected: tuple[str, ...] = (), shm: str | None = None) -> None:
        self.root = root
        self.shm = shm
        self.charge = charge
        self.protected = protected
        self._inodes: dict[hardlinks.Inode, str] | None = None  # walked once, on first need

    def _open(self, path: str, flags: int, mode: int = 0) -> int:
        fd = self._open_raw(path, flags, mode)
        self._guard(fd, path)
        return fd

    def _in_shm(self, path: str) -> str | None:
        """``path`` relative to /dev/shm (``"/"`` for itself) when it names a place there
        and this sandbox has one. Decided on the path with ``..`` folded: nothing on the
        way is a symlink (/dev and /dev/shm are the sandbox's mounts; under /dev/shm,
        symlinks are not followed), so folding is what the sandbox's kernel would do."""
        if self.shm is None:
            return None
        folded = posixpath.normpath(normalize_path(path))
        if not prot.covering((SHM,), folded):
            return None
        return "/" + folded[len(SHM):].lstrip("/")

    def _open_raw(self, path: str, flags: int, mode: int = 0, *, check: bool = True) -> int:
        """``path`` opened in the root (or in /dev/shm's directory); with ``check``, refused
        when the kernel resolved it into the sandbox's kernel or device filesystems."""
        inner = self._in_shm(path)
        top, resolve = self.root, 0
        if inner is not None and self.shm is not None:
            top, resolve = self.shm, RESOLVE_NO_SYMLINKS
        rootfd = os.open(top, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fd = openat2(rootfd, path if inner is None else inner, flags, mode, resolve)
        except FileNotFoundError:
            if check and inner is None:
                self._check_missing(rootfd, path)  # /proc/self is not in the root
            raise
        finally:
            os.close(rootfd)
        if check and inner is None:
            try:
                self._check_kernel_fs(path, self._where(fd))
            except BaseException:
                os.close(fd)
                raise
        return fd

    def _check_missing(self, rootfd: int, path: str) -> None:
        """For a ``path`` that does not resolve: InvalidArgument if its nearest ancestor
        that does, followed by the rest of it, names a place in the kernel filesystems
        (most of those files exist only there, not in the root)."""
        p = PurePosixPath(normalize_path(path))
        for up in p.parents:
            try:
                fd = openat2(rootfd, str(up), os.O_PATH)
            except OSError:
                continue
            try:
                where = self._where(fd)
            finally:
                os.close(fd)
            rest = str(p.relative_to(up))
            self._check_kernel_fs(path, posixpath.normpath(posixpath.join(where, rest)))
            return

    @staticmethod
    def _check_kernel_fs(asked: str, where: str) -> None:
        """InvalidArgument if ``where`` (resolved in the root) is under /proc, /sys or /dev:
        /dev/shm too, as the root's own directory there is not the sandbox's tmpfs."""
        if prot.covering(KERNEL_FS, where):
            raise kernel_fs_refusal(normalize_path(asked), where)

    def open_path(self, path: str) -> int:
        """An ``O_PATH`` fd of ``path`` resolved in the root, unchecked (the caller closes)."""
        return self._open_raw(path, os.O_PATH, check=False)

    def _where(self, fd: int) -> str:
        """The sandbox path the kernel resolved ``fd`` to."""
        real = os.readlink(f"/proc/self/fd/{fd}")
        for top, at in self._tops:
            if real == top or real.startswith(top.rstrip("/") + "/"):
                return posixpath.join(at, real[len(top):].lstrip("/")).rstrip("/") or "/"
        raise InvalidArgument(f"{real} is outside the sandbox root")  # cannot happen

    @functools.cached_property
    def _tops(self) -> list[tuple[str, str]]:
        """(host directory, sandbox path) of the root and /dev/shm, resolved once: every
        file operation names what the kernel opened by them (_where)."""
        return [(os.path.realpath(top), at) for top, at in ((self.root, "/"), (self.shm, SHM))
                if top is not None]

    def _guard(self, fd: int, asked: str, name: str | None = None) -> None:
        """Close ``fd`` and raise Forbidden if it (or its entry ``name``) is protected, by
        path or (an opened file) as a hard link to a protected file."""
        if not self.protected:
            return
        try:
            where = self._where(fd)
            if name is not None:
                where = str(PurePosixPath(where, name))
            prot.check_path(self.protected, normalize_path(asked), where)
            if name is None:
                self.check_inode(os.fstat(fd), asked)
        except BaseException:
            os.close(fd)
            raise

    def protected_inodes(self) -> dict[hardlinks.Inode, str]:
        """The multiply-linked files under the protected paths, walked once per operation
        (this object serves one request)."""
        if self._inodes is None:
            self._inodes = hardlinks.protected_inodes(
                self.open_path, self.protected)
        return self._inodes

    def check_inode(self, s: os.stat_result, asked: str) -> None:
        """Forbidden if ``s`` (what ``asked`` led to) is a protected file under another
        name: a hard link, say one shipped in an image layer."""
        if not self.protected or not hardlinks.linked(s):
            return
        hit = self.protected_inodes().get((s.st_dev, s.st_ino))
        if hit is not None:
            raise Forbidden(f"{normalize_path(asked)} is protected: it is a hard link to a "
                            f"file under {hit}, one of the sandbox's protected_paths, which "
                            "only the grading identity (a grader or admin token) reaches "
                            "through the files API")

    def _resolved(self, path: str) -> str:
        """Where ``path``'s parent resolves, plus its last name (not followed)."""
        dfd, name = self._parent(path)
        try:
            return str(PurePosixPath(self._where(dfd), name))
        finally:
            os.close(dfd)

    def _parent(self, path: str, asked: str | None = None) -> tuple[int, str]:
        """An ``O_PATH`` fd of the directory holding ``path``'s entry, and its name there,
        checked as the entry (the caller closes)."""
        p = PurePosixPath(normalize_path(path))
        if p.name in ("", ".", ".."):
            raise InvalidArgument(f"path names no entry: {path}")
        inner = self._in_shm(path)
        if inner == "/":  # /dev/shm itself: its entry is the host directory's
            prot.check_path(self.protected, normalize_path(asked or path), SHM)
            assert self.shm is not None
            up, name = os.path.split(os.path.abspath(self.shm))
            return os.open(up, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC), name
        dfd = self._open_raw(str(p.parent), os.O_PATH | os.O_DIRECTORY)
        if inner is None:
            try:
                self._check_kernel_fs(asked or path, str(PurePosixPath(self._where(dfd),
                                                                       p.name)))
            except BaseException:
                os.close(dfd)
                raise
        self._guard(dfd, asked or path, p.name)
        return dfd, p.name

    def open_entry(self, path: str) -> tuple[int, str]:
        """:meth:`_parent` for tarstream: where a walk of ``path`` starts."""
        return self._parent(path)

    def stat(self, path: str) -> FileInfo:
        path = normalize_path(path)
        with _Errors(path):
            if path == "/":
                return _info(path, os.stat(self.root))
            dfd, name = self._parent(path)
            try:
                s = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            finally:
                os.close(dfd)
            self.check_inode(s, path)
            return _info(path, s)

    def list(self, path: str) -> list[FileInfo]:
        path = normalize_path(path)
        with _Errors(path):
            fd = self._open(path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                out = []
                for name in sorted(os.listdir(fd)):
                    s = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    out.append(_info(str(PurePosixPath(path, name)), s))
                return out
            finally:
                os.close(fd)

    def mkdir(self, path: str, parents: bool = True) -> None:
        path = normalize_path(path)
        with _Errors(path):
            first = 0
            if self._in_shm(path) is not None:  # /dev and /dev/shm are there; start below
                path, first = posixpath.normpath(path), len(PurePosixPath(SHM).parts) - 1
            parts = PurePosixPath(path).parts[1:]
            todo = range(first, len(parts)) if parents else [len(parts) - 1]
            for i in todo:
                sub = "/" + "/".join(parts[: i + 1])
                dfd, name = self._parent(sub, path)
                try:
                    os.mkdir(name, 0o755, dir_fd=dfd)
                except FileExistsError:
                    if i == len(parts) - 1 and not parents:
                        raise
                finally:
                    os.close(dfd)

    def remove(self, path: str, recursive: bool = False) -> None:
        path = normalize_path(path)
        if path == "/":
            raise InvalidArgument("refusing to remove the sandbox root")
        if self._in_shm(path) == "/":
            raise InvalidArgument(f"refusing to remove {SHM}, the sandbox's shared-memory "
                                  "mount; remove the entries in it")
        with _Errors(path):
            dfd, name = self._parent(path)
            try:
                s = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                if self.protected and st.S_ISDIR(s.st_mode):
                    where = str(PurePosixPath(self._where(dfd), name))
                    prot.check_tree(self.protected, path, where)
                if not st.S_ISDIR(s.st_mode):
                    os.unlink(name, dir_fd=dfd)
                elif recursive:
                    fdtree.remove_tree(dfd, name)  # iterative: any depth the sandbox made
                else:
                    os.rmdir(name, dir_fd=dfd)
            finally:
                os.close(dfd)

    def open_read(self, path: str) -> BinaryIO:
        path = normalize_path(path)
        with _Errors(path):
            fd = self._open(path, os.O_RDONLY)
            if st.S_ISDIR(os.fstat(fd).st_mode):
                os.close(fd)
                raise InvalidArgument(f"{path} is a directory; use list or download a tar")
            return os.fdopen(fd, "rb", buffering=0)

    def open_write(self, path: str, mode: int = 0o644) -> BinaryIO:
        path = normalize_path(path)
        with _Errors(path):
            fd = self._open_checked_write(path, mode)
            if self.charge is not None:
                return ChargedWriter(fd, self.charge, path)  # type: ignore[return-value]
            return os.fdopen(fd, "wb", buffering=0)

    def _open_checked_write(self, path: str, mode: int) -> int:
        """``path`` opened for writing once the file it leads to is known to be neither
        protected nor on a kernel filesystem (nothing is created before that): an existing
        file is opened as a bare handle (``O_PATH``: nothing truncated yet), checked, then
        reopened by that handle; a new one is created in its checked parent and may not be
        a symlink (``RESOLVE_NO_SYMLINKS``) by the time it is. A dangling symlink is
        followed hop by hop, each hop checked the same way."""
        asked = path
        for _ in range(40):  # the kernel's own limit of symlinks in one resolution
            try:
                pfd = self._open(path, os.O_PATH)
            except FileNotFoundError:
                pfd = None
            if pfd is not None:
                try:
                    if st.S_ISDIR(os.fstat(pfd).st_mode):
                        raise InvalidArgument(f"{asked} is a directory; name a file to write")
                    return os.open(f"/proc/self/fd/{pfd}",
                                   os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
                finally:
                    os.close(pfd)
            dfd, name = self._parent(path, asked)
            try:
                return openat2(dfd, name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode,
                               RESOLVE_NO_SYMLINKS)
            except OSError as exc:
                if exc.errno != errno.ELOOP or self._in_shm(path) is not None:
                    raise
                if self.protected:  # the hops of a symlink the sandbox may swap meanwhile
                    raise InvalidArgument(
                        f"{asked} is a symlink to a file that does not exist; in a sandbox "
                        "with protected_paths, write to the file's own path") from exc
                path = posixpath.join(self._where(dfd), os.readlink(name, dir_fd=dfd))
            finally:
                os.close(dfd)
        raise InvalidArgument(f"{asked}: too many levels of symbolic links")

    def tar_out(self, path: str) -> Iterator[bytes]:
        """A tar stream of ``path`` (a directory or file), built entry by entry."""
        from dsec.node.host.tarstream import tar_chunks
        path = normalize_path(path)
        self._check_tree(path)
        self.stat(path)
        if self.protected and self.protected_inodes():
            self._check_links_in(path)  # before the first byte, so the refusal is a 403
        return tar_chunks(self, path)

    def _check_links_in(self, path: str) -> None:
        """Forbidden if the tree at ``path`` holds a hard link to a protected file (the
        stream checks each file again as it sends it)."""
        with _Errors(path):
            fd = self._open(path, os.O_PATH)
            try:
                if not st.S_ISDIR(os.fstat(fd).st_mode):
                    return
                for e in fdtree.walk(fd, "."):
                    if not st.S_ISDIR(e.stat.st_mode):
                        self.check_inode(e.stat, str(PurePosixPath(path, e.path)))
            finally:
                os.close(fd)

    def _check_tree(self, path: str) -> None:
        """Forbidden when a whole-tree operation at ``path`` would reach a protected path
        (the walk itself opens entries without these checks)."""
        if not self.protected:
            return
        with _Errors(path):
            if path == "/":
                where = "/"
            else:
                try:
                    fd = self._open(path, os.O_PATH)
                except FileNotFoundError:
                    where = self._resolved(path)
                else:
                    try:
                        where = self._where(fd)
                    finally:
                        os.close(fd)
            prot.check_tree(self.protected, path, where)

    def tar_in(self, path: str, stream: BinaryIO, max_bytes: int) -> int:
        """Unpack a tar stream under ``path``; hostile entries are refused by name."""
        from dsec.node.host.tarstream import untar_into
        path = normalize_path(path)
        self.mkdir(path)
        with _Errors(path):
            return untar_into(self, path, stream, max_bytes)

    # used by tarstream
    def open_dir_fd(self, path: str) -> int:
        return self._open(normalize_path(path), os.O_RDONLY | os.O_DIRECTORY)

    def symlink(self, target: str, path: str) -> None:
        dfd, name = self._parent(path)
        try:
            os.symlink(target, name, dir_fd=dfd)
        finally:
            os.close(dfd)

