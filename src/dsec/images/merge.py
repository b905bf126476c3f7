"""Merge consecutive layers into one, offline, with overlay semantics.

Layers are applied bottom to top into a staging tree: a later entry replaces an earlier
one, a whiteout removes what the range had at that path, an opaque directory drops what
the range had below it. A whiteout is kept only if a layer below the merged range has that
path (overlayfs lists a whiteout as a broken entry in a directory no lower layer has), and
opaque markers only if layers lie below the range at all. A
directory that replaces a non-directory becomes opaque, because in the stack the
non-directory hid every lower directory of that name.
"""

from __future__ import annotations

import os
import pathlib
import stat

from dsec.images.stage import copy_entry, copy_meta, walk
from dsec.images.whiteout import is_opaque, is_whiteout, set_opaque
from dsec.node.host import fdtree

__all__ = ["merge_trees"]


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        fdtree.remove_path(path)  # at any depth: a pack_diff layer can nest past 1,000
    elif os.path.lexists(path):
        os.unlink(path)


def _apply(src_root: str, dest_root: str, below: list[pathlib.Path]) -> None:
    keep_markers = bool(below)
    links: dict[tuple[int, int], str] = {}
    dirs = []
    for dirpath, dirnames, filenames in walk(src_root):
        rel = os.path.relpath(dirpath, src_root)
        out_dir = os.path.normpath(os.path.join(dest_root, rel))
        for name in list(dirnames):
            src, dst = os.path.join(dirpath, name), os.path.join(out_dir, name)
            st = os.lstat(src)
            if stat.S_ISLNK(st.st_mode):
                dirnames.remove(name)
                filenames.append(name)
                continue
            replaced_other = os.path.lexists(dst) and not (os.path.isdir(dst)
                                                             and not os.path.islink(dst))
            if replaced_other:
                _remove(dst)
            if is_opaque(src) and os.path.isdir(dst):
                fdtree.remove_path(dst)
            if not os.path.lexists(dst):
                os.mkdir(dst)
            dirs.append((src, dst, st, replaced_other))
        for name in filenames:
            src, dst = os.path.join(dirpath, name), os.path.join(out_dir, name)
            st = os.lstat(src)
            _remove(dst)
            if is_whiteout(st) and not any(
                    os.path.lexists(b / rel / name) for b in below):
                continue
            copy_entry(src, dst, links)
    for src, dst, st, replaced_other in reversed(dirs):
        copy_meta(src, dst, st)
        if keep_markers and replaced_other:
            set_opaque(dst)
        elif not keep_markers and is_opaque(dst):
            os.removexattr(dst, "trusted.overlay.opaque")


def merge_trees(layers: list[pathlib.Path], dest: pathlib.Path,
                below: list[pathlib.Path]) -> None:
    """Apply layer trees ``layers`` (bottom first) into the empty directory ``dest``.

    ``below``: the trees of the layers that stay under the result (decides which
    whiteouts and opaque markers the result needs).
    """
    for layer in layers:
        _apply(str(layer), str(dest), below)
    copy_meta(str(layers[-1]), str(dest), os.lstat(layers[-1]))
