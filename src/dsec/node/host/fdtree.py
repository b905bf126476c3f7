"""Walk and remove a directory tree a sandbox made, at any depth, by file descriptor.

A sandbox can nest directories as deep as the kernel lets it (thousands of levels with
``mkdir d && cd d``). A recursive walk dies of Python's recursion limit there, and a walk
by path of ``PATH_MAX``, so these keep an explicit stack of open directories and name every
entry relative to its parent's fd. Directories are opened with ``O_NOFOLLOW``: a symlink
the sandbox swaps in while the walk runs is never followed, so the walk stays under the
directory it started from. The cost is one open fd per level of depth.
"""

from __future__ import annotations

import os
import stat as st
from collections.abc import Iterator
from typing import NamedTuple

__all__ = ["Entry", "walk", "remove_tree", "remove_path", "rmtree"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Entry(NamedTuple):
    """One entry of a walk: its path from the walk's top, its ``lstat``, and the open
    directory (``dfd``) holding it under ``name``."""

    path: str
    stat: os.stat_result
    dfd: int
    name: str


class _Frame(NamedTuple):
    fd: int
    path: str
    names: list[str]  # still to visit, last first
    parent: int
    name: str


def walk(dfd: int, name: str, *, remove_dirs: bool = False,
         prune: frozenset[str] = frozenset()) -> Iterator[Entry]:
    """Every entry at and under ``name`` in ``dfd``, parents before children, each
    directory's entries in name order. Symlinks are reported, never followed; entries that
    vanish during the walk are skipped. The caller may act on a yielded non-directory (read
    it, unlink it) before asking for the next entry; ``dfd`` is valid until then.

    With ``remove_dirs``, each directory is removed once everything under it was yielded
    (the caller unlinks the rest): :func:`remove_tree`. Directories whose path is in
    ``prune`` are yielded, their entries not."""
    try:
        top = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return
    yield Entry(name, top, dfd, name)
    if not st.S_ISDIR(top.st_mode):
        return
    stack: list[_Frame] = []
    try:
        _push(stack, dfd, name, name)
        while stack:
            frame = stack[-1]
            if not frame.names:
                stack.pop()
                os.close(frame.fd)
                if remove_dirs:
                    os.rmdir(frame.name, dir_fd=frame.parent)
                continue
            child = frame.names.pop()
            path = f"{frame.path}/{child}"
            try:
                s = os.stat(child, dir_fd=frame.fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            yield Entry(path, s, frame.fd, child)
            if st.S_ISDIR(s.st_mode) and path not in prune:
                _push(stack, frame.fd, child, path)
    finally:
        for frame in stack:
            os.close(frame.fd)


def _push(stack: list[_Frame], parent: int, name: str, path: str) -> None:
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        return
    try:
        names = sorted(os.listdir(fd), reverse=True)
    except BaseException:
        os.close(fd)
        raise
    stack.append(_Frame(fd, path, names, parent, name))


def remove_tree(dfd: int, name: str) -> None:
    """Remove ``name`` in ``dfd`` and everything under it, never following a symlink."""
    for e in walk(dfd, name, remove_dirs=True):
        if not st.S_ISDIR(e.stat.st_mode):
            try:
                os.unlink(e.name, dir_fd=e.dfd)
            except FileNotFoundError:
                pass


def remove_path(path: str | os.PathLike[str]) -> None:
    """``shutil.rmtree(path)`` at any depth (Python 3.11's recurses per level)."""
    parent, name = os.path.split(os.path.abspath(path))
    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        remove_tree(fd, name)
    finally:
        os.close(fd)


def rmtree(path: str | os.PathLike[str]) -> None:
    """``shutil.rmtree(path, ignore_errors=True)`` at any depth, for a work directory that
    holds a copy of a sandbox's tree (its RecursionError would not be an ignored OSError)."""
    try:
        remove_path(path)
    except OSError:
        pass
