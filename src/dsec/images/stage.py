"""Copy an overlay upper directory into a clean staging tree for ``mkfs.erofs``.

The upper directory holds more than the sandbox's changes: overlayfs bookkeeping xattrs
(``origin``, ``impure``, ``nlink``) that name inodes of this node only, and paths the caller
wants cleaned before packing. Copying (rather than packing the upper dir in place) drops
both, keeps whiteouts and opaque markers, and never touches a live sandbox's files.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import pathlib
import shutil
import stat

from dsec.api.errors import InvalidArgument
from dsec.images.whiteout import OPAQUE_XATTR, OVERLAY_XATTR_PREFIX, is_whiteout

__all__ = ["stage_upper", "excluded", "copy_entry", "copy_meta", "walk"]

# Layers made with these overlay features depend on the exact lower layers of one node.
_UNSUPPORTED = ("trusted.overlay.redirect", "trusted.overlay.metacopy")
_USER_PREFIX = "user.overlay."


def walk(top: str | os.PathLike[str]):
    """``os.walk(top)`` top-down (symlinks to directories listed in ``dirnames``, not
    entered; pruning ``dirnames`` prunes the walk), without recursion: Python 3.11's
    recurses per level, and a sandbox can nest its upper dir past the recursion limit.
    Unlike ``os.walk`` it does not skip a directory it cannot list; a path too long to
    name is InvalidArgument."""
    stack = [os.fspath(top)]
    while stack:
        dirpath = stack.pop()
        try:
            with os.scandir(dirpath) as it:
                entries = list(it)
        except FileNotFoundError:
            continue
        except OSError as exc:
            if exc.errno == errno.ENAMETOOLONG:
                raise InvalidArgument(
                    f"a directory nests deeper than a host path can name ({len(dirpath)} "
                    f"characters at {dirpath[:80]}...); flatten it or exclude it") from exc
            raise
        dirnames = [e.name for e in entries if e.is_dir()]
        filenames = [e.name for e in entries if not e.is_dir()]
        yield dirpath, dirnames, filenames
        for name in reversed(dirnames):  # popped in listing order, as os.walk
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                stack.append(path)


def excluded(rel: str, patterns: list[str]) -> bool:
    """True if ``rel`` ('/a/b', rooted at the sandbox's /) is or is under a pattern.

    A pattern is an absolute path (``/tmp``) or an fnmatch glob (``/root/.cache/*``,
    ``*.pyc``); a matching directory drops its whole subtree.
    """
    for pat in patterns:
        p = "/" + pat.strip("/") if not pat.startswith("*") else pat
        if rel == p or rel.startswith(p.rstrip("/") + "/") or fnmatch.fnmatchcase(rel, p):
            return True
    return False


def _copy_xattrs(src: str, dst: str) -> None:
    for name in os.listxattr(src, follow_symlinks=False):
        # An overlay mounted with 'userxattr' keeps its markers under user.overlay.*;
        # layers always carry the trusted.* form the node's root overlay reads.
        generic = "trusted." + name[len("user."):] if name.startswith(_USER_PREFIX) else name
        if generic.startswith(_UNSUPPORTED):
            raise InvalidArgument(
                f"{src} carries {name}: mount the sandbox overlay with redirect_dir=off "
                f"and metacopy=off to pack it")
        if generic.startswith(OVERLAY_XATTR_PREFIX) and generic != OPAQUE_XATTR:
            continue
        os.setxattr(dst, generic, os.getxattr(src, name, follow_symlinks=False),
                    follow_symlinks=False)


def copy_meta(src: str, dst: str, st: os.stat_result, *, is_link: bool = False) -> None:
    """Copy owner, mode, mtime and xattrs (less overlay bookkeeping) from src to dst."""
    os.chown(dst, st.st_uid, st.st_gid, follow_symlinks=False)
    if not is_link:
        _copy_xattrs(src, dst)
        os.chmod(dst, stat.S_IMODE(st.st_mode))
    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)


def stage_upper(upper: pathlib.Path, dest: pathlib.Path, exclude: list[str] | None = None) -> int:
    """Copy ``upper`` into the empty directory ``dest``; returns the number of entries.

    Kept: files, directories, symlinks, hard links, fifos, whiteouts, opaque markers,
    ownership, modes (setuid included: a packed sandbox may legitimately install one),
    mtimes, user/security xattrs. Dropped: other device nodes, sockets, excluded paths.
    """
    exclude = exclude or []
    links: dict[tuple[int, int], str] = {}
    count = 0
    dirs: list[tuple[str, str, os.stat_result]] = []
    for dirpath, dirnames, filenames in walk(upper):
        rel_path = os.path.relpath(dirpath, upper)
        rel_dir = "/" if rel_path == "." else "/" + rel_path
        out_dir = os.path.join(dest, rel_path)
        keep = []
        for name in sorted(dirnames):
            src = os.path.join(dirpath, name)
            rel = rel_dir.rstrip("/") + "/" + name
            st = os.lstat(src)
            if excluded(rel, exclude):
                continue
            if stat.S_ISLNK(st.st_mode):  # os.walk lists symlinks to dirs as dirs
                filenames.append(name)
                continue
            os.mkdir(os.path.join(out_dir, name))
            dirs.append((src, os.path.join(out_dir, name), st))
            keep.append(name)
            count += 1
        dirnames[:] = keep
        for name in sorted(filenames):
            src = os.path.join(dirpath, name)
            rel = rel_dir.rstrip("/") + "/" + name
            if excluded(rel, exclude):
                continue
            count += copy_entry(src, os.path.join(out_dir, name), links)
    for src, dst, st in reversed(dirs):  # after children, so mtimes stick
        copy_meta(src, dst, st)
    copy_meta(str(upper), str(dest), os.lstat(upper))
    return count


def _copy_regular(src: str, dst: str, st: os.stat_result) -> bool:
    """Copy a regular file's bytes; False if ``src`` changed into anything else meanwhile.

    The upper dir belongs to a sandbox: opening with O_NOFOLLOW and checking the inode
    keeps a file swapped for a symlink (to a host path) from being read by the node.
    """
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    with open(fd, "rb") as fin:
        now = os.fstat(fd)
        if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            return False
        with open(dst, "wb") as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
    return True


def copy_entry(src: str, dst: str, links: dict[tuple[int, int], str]) -> int:
    """Copy one non-directory entry; returns 1 if copied, 0 if dropped (devices, sockets).

    ``links`` maps (dev, ino) of multiply-linked sources to their first copy, so hard
    links stay hard links.
    """
    st = os.lstat(src)
    mode = st.st_mode
    if stat.S_ISREG(mode) and st.st_nlink > 1:
        first = links.get((st.st_dev, st.st_ino))
        if first is not None:
            os.link(first, dst)
            return 1
        links[(st.st_dev, st.st_ino)] = dst
    if stat.S_ISREG(mode):
        if not _copy_regular(src, dst, st):
            return 0
    elif stat.S_ISLNK(mode):
        os.symlink(os.readlink(src), dst)
        copy_meta(src, dst, st, is_link=True)
        return 1
    elif is_whiteout(st):
        os.mknod(dst, stat.S_IFCHR | 0o600, os.makedev(0, 0))
    elif stat.S_ISFIFO(mode):
        os.mkfifo(dst)
    else:
        return 0  # device nodes and sockets are not layer content
    copy_meta(src, dst, st)
    return 1
