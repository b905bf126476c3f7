"""At create: refuse an image that gives a protected file a name outside the protected paths.

Landlock checks the name a command uses, so a hard link shipped in a layer (``/srv/h`` one
inode with ``/grader/secret.txt``) would give agent commands the file by that name. The
answer depends only on the layers (content-addressed) and the protected paths, so it is
worked out once per pair on a node and remembered: a burst of creates of one image, and the
warm pool's sandboxes (which share their image), cost one walk, and that walk covers the
protected paths only (:func:`dsec.node.host.hardlinks.stray_names`), never the whole image.

Every backend's root filesystem is the merged view of the same layer mounts: a container's
overlay, a microvm's overlay of the same EROFS files inside the guest, a vm's disk copied
(``cp -a``, links kept) from that view. So guests are checked on the host, before they boot.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from dsec.api.errors import InvalidArgument
from dsec.node.host import mounts
from dsec.node.host.hardlinks import stray_names
from dsec.node.host.rooted import RootedFiles

__all__ = ["ImageLinks", "merged_view"]

Key = tuple[tuple[str, ...], tuple[str, ...]]


def _refusal(stray: list[tuple[str, int, int]]) -> str | None:
    if not stray:
        return None
    path, total, inside = stray[0]
    return (f"the image gives the protected file {path} {total - inside} more name(s) "
            f"outside protected_paths (hard links, {total} names in all), through which "
            "agent commands could read it; remove those links from the image, or "
            "protect the directories that hold them too")


class ImageLinks:
    """The create-time hard-link check, remembered per (layers, protected paths)."""

    def __init__(self, maxsize: int = 4096) -> None:
        self.maxsize = maxsize
        self.walks = 0  # how many checks walked a root (the rest were remembered)
        self._known: OrderedDict[Key, str | None] = OrderedDict()
        self._lock = threading.Lock()

    def check(self, layer_digests: Sequence[str], protected: Sequence[str],
              root: Callable[[], AbstractContextManager[str]]) -> None:
        """Raise :class:`InvalidArgument` if the image of ``layer_digests`` gives a file at
        or under ``protected`` a name outside them. ``root()`` yields a host directory
        holding that image's merged, unmodified tree; it is entered only when the answer
        is not known yet."""
        key = (tuple(layer_digests), tuple(sorted(set(protected))))
        with self._lock:
            known = key in self._known
            if known:
                self._known.move_to_end(key)
                msg = self._known[key]
        if not known:
            with root() as top:
                msg = _refusal(stray_names(RootedFiles(top).open_path, list(protected)))
            with self._lock:
                self.walks += 1
                self._known[key] = msg
                while len(self._known) > self.maxsize:
                    self._known.popitem(last=False)
        if msg:
            raise InvalidArgument(msg)


@contextmanager
def merged_view(lowerdirs: Sequence[Path], work: Path) -> Iterator[str]:
    """The merged tree of read-only layer mounts (top first), as a guest sees it: the one
    layer itself, or a read-only overlay mounted under ``work`` for the time of the block."""
    if len(lowerdirs) == 1:
        yield str(lowerdirs[0])
        return
    work.mkdir(parents=True, exist_ok=True)
    mnt = tempfile.mkdtemp(prefix="links-", dir=work)
    try:
        mounts.mount("overlay", mnt, "overlay", mounts.MS_RDONLY,
                     "lowerdir=" + ":".join(str(p) for p in lowerdirs))
        try:
            yield mnt
        finally:
            mounts.umount(mnt)
    finally:
        os.rmdir(mnt)
