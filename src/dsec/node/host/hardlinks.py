"""Hard links into a sandbox's protected paths, found by inode.

A path check cannot see a hard link: ``/tmp/x`` and ``/grader/secret.txt`` can be one inode
under two names. Agent commands cannot make one (Landlock refuses the link), but an image's
own layers can ship one, and the grading step can make one. So after the kernel resolved a
path, :class:`dsec.node.host.rooted.RootedFiles` also asks whether the file it opened is,
by ``(st_dev, st_ino)``, one under a protected path.

Cheap by construction: only a non-directory with ``st_nlink > 1`` can be such a link (a
directory cannot be hard-linked), so only then are the protected paths walked, once per
file operation, and only their multiply-linked files are kept. At create, a container
whose image gives a protected file a name outside the protected paths is refused
(:func:`stray_names`): Landlock, which checks the path an agent command names, cannot see
such a name either.
"""

from __future__ import annotations

import os
import stat as st
from collections.abc import Callable, Iterator, Sequence
from pathlib import PurePosixPath

from dsec.node.host import fdtree

__all__ = ["Inode", "linked", "protected_inodes", "stray_names"]

Inode = tuple[int, int]


def linked(s: os.stat_result) -> bool:
    """Whether ``s`` could be another name of a protected file."""
    return not st.S_ISDIR(s.st_mode) and s.st_nlink > 1


def _linked_names(open_in_root: Callable[[str], int], protected: Sequence[str]
                  ) -> Iterator[tuple[str, str, os.stat_result]]:
    """(protected path, sandbox path, stat) of each multiply-linked file at or under one."""
    for top in protected:
        try:
            fd = open_in_root(top)
        except OSError:
            continue
        try:
            s = os.fstat(fd)
            if not st.S_ISDIR(s.st_mode):
                if linked(s):
                    yield top, top, s
                continue
            for e in fdtree.walk(fd, "."):  # iterative: any depth
                if linked(e.stat):
                    yield top, str(PurePosixPath(top, e.path)), e.stat
        finally:
            os.close(fd)


def protected_inodes(open_in_root: Callable[[str], int],
                     protected: Sequence[str]) -> dict[Inode, str]:
    """``(st_dev, st_ino)`` of every multiply-linked file at or under a protected path,
    mapped to that protected path. ``open_in_root(path)`` opens a sandbox path (resolved in
    the sandbox root) as an fd (O_PATH will do); protected paths that do not exist are
    skipped."""
    found: dict[Inode, str] = {}
    for top, _path, s in _linked_names(open_in_root, protected):
        found.setdefault((s.st_dev, s.st_ino), top)
    return found


def stray_names(open_in_root: Callable[[str], int],
                protected: Sequence[str]) -> list[tuple[str, int, int]]:
    """Files at or under protected paths with names outside them, as (path, names in all,
    names inside): Landlock checks the path a command names, so such a name would give an
    agent command the file."""
    inside: dict[Inode, set[str]] = {}
    first: dict[Inode, tuple[str, int]] = {}
    for _top, path, s in _linked_names(open_in_root, protected):
        key = (s.st_dev, s.st_ino)
        inside.setdefault(key, set()).add(path)
        first.setdefault(key, (path, s.st_nlink))
    return [(path, nlink, len(inside[key])) for key, (path, nlink) in first.items()
            if len(inside[key]) < nlink]
