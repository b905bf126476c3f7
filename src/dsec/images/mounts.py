"""Node-wide layer mounts: each layer mounted once, read-only, shared by every sandbox.

Several threads and several processes (node agent, tests, CLI) may resolve at once, so the
slow path runs under a thread lock plus an ``flock`` on ``<images>/.lock``; the fast path
(already mounted) is a single ``stat``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
import threading
from collections.abc import Callable, Iterator

from dsec.images import erofs
from dsec.images.refs import digest_hex

__all__ = ["LayerMounts", "StoreLock"]


class StoreLock:
    """A lock that excludes other threads of this process and other processes."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path
        self._thread_lock = threading.Lock()

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Hold the lock for the duration of the ``with`` block (not re-entrant)."""
        with self._thread_lock:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)


class LayerMounts:
    """Mount points under ``mnt_dir``, one per layer digest.

    ``source_for(digest)`` returns the file to mount after verifying it (the local blob, or
    a lazily fetched FUSE file for a remote store); it is called only when a layer is not
    yet mounted, under the lock. ``healthy(digest)`` says whether an existing mount still
    has its source (a lazy layer's daemon may have died).
    """

    def __init__(self, mnt_dir: pathlib.Path, lock: StoreLock,
                 source_for: Callable[[str], pathlib.Path],
                 healthy: Callable[[str], bool] = lambda digest: True) -> None:
        self.mnt_dir = mnt_dir
        self.lock = lock
        self.source_for = source_for
        self.healthy = healthy
        mnt_dir.mkdir(parents=True, exist_ok=True)

    def path(self, digest: str) -> pathlib.Path:
        """The mount point of a layer (mounted or not)."""
        return self.mnt_dir / digest_hex(digest)

    def ensure(self, digest: str) -> pathlib.Path:
        """Mount the layer if it is not mounted yet; return its mount point."""
        target = self.path(digest)
        if erofs.is_mounted(target) and self.healthy(digest):
            return target
        with self.lock.hold():
            if erofs.is_mounted(target) and not self.healthy(digest):
                erofs.umount(target)  # its lazy-loading daemon died: mount it afresh
            if not erofs.is_mounted(target):
                source = self.source_for(digest)
                target.mkdir(exist_ok=True)
                erofs.mount_file(source, target)
        return target

    def mounted(self) -> set[str]:
        """Digests of layers mounted right now."""
        return {"sha256:" + p.name for p in self.mnt_dir.iterdir() if erofs.is_mounted(p)}

    def unmount(self, digest: str) -> None:
        """Unmount one layer (lazily if still in use) and remove its mount point."""
        target = self.path(digest)
        erofs.umount(target)
        with contextlib.suppress(OSError):
            target.rmdir()

    def unmount_all(self) -> None:
        """Unmount every layer mount under ``mnt_dir``."""
        with self.lock.hold():
            for p in self.mnt_dir.iterdir():
                if p.is_dir():
                    for _ in range(8):  # a stale stack of mounts: peel each one
                        if not erofs.is_mounted(p):
                            break
                        erofs.umount(p)
                    with contextlib.suppress(OSError):
                        p.rmdir()
