"""Start, find and stop the node's lazy-loading FUSE daemon (:mod:`dsec.images.lazyfs`)."""

from __future__ import annotations

import contextlib
import errno
import os
import pathlib
import subprocess
import sys
import time

from dsec.api.errors import Internal
from dsec.images import erofs

__all__ = ["LazyDaemon"]


class LazyDaemon:
    """One FUSE daemon per node store, mounted at ``mountpoint``, outliving its starter."""

    def __init__(self, mountpoint: pathlib.Path, cache: pathlib.Path, url: str,
                 token: str | None = None, cache_max_bytes: int | None = None) -> None:
        self.mountpoint, self.cache, self.url, self.token = mountpoint, cache, url, token
        self.cache_max_bytes = cache_max_bytes
        self.log = cache / "lazyfs.log"
        self.pidfile = cache / "lazyfs.pid"
        self._proc: subprocess.Popen | None = None

    def alive(self) -> bool:
        """True if the FUSE filesystem is mounted and answering."""
        if self._proc is not None:
            running = self._proc.poll() is None
        else:
            pid = _read_pid(self.pidfile)
            running = pid is not None and _exists(pid)
        if running and erofs.is_mounted(self.mountpoint):
            return True
        # The daemon died (its mount answers ENOTCONN, or stale cached attributes): clear
        # the dead mount so a new daemon can mount in its place.
        for _ in range(4):
            try:
                os.stat(self.mountpoint)
                if not erofs.is_mounted(self.mountpoint):
                    break
            except FileNotFoundError:
                break
            except OSError as exc:
                if exc.errno != errno.ENOTCONN:
                    raise
            erofs.umount(self.mountpoint)
        return False

    def ensure(self, timeout: float = 15.0) -> None:
        """Start the daemon unless it is running; wait until it is mounted."""
        if self.alive():
            return
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self.cache.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        if self.token:
            env["DSEC_TOKEN"] = self.token
        with open(self.log, "ab") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "dsec.images.lazyfs", "--mount", str(self.mountpoint),
                 "--cache", str(self.cache), "--url", self.url,
                 *(["--cache-max-bytes", str(self.cache_max_bytes)]
                   if self.cache_max_bytes else [])],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                start_new_session=True)
        self.pidfile.write_text(str(self._proc.pid))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                break
            if erofs.is_mounted(self.mountpoint):
                return
            time.sleep(0.02)
        tail = self.log.read_text(errors="replace")[-800:] if self.log.exists() else ""
        self.stop()
        raise Internal(f"lazy-loading daemon did not come up at {self.mountpoint}: {tail}")

    def stop(self, timeout: float = 10.0) -> None:
        """Unmount the FUSE filesystem (the daemon then exits) and wait for the daemon."""
        for _ in range(4):
            if not erofs.is_mounted(self.mountpoint):
                break
            erofs.umount(self.mountpoint)
        pid = self._proc.pid if self._proc else _read_pid(self.pidfile)
        deadline = time.monotonic() + timeout
        while pid and time.monotonic() < deadline:
            if self._proc is not None:
                if self._proc.poll() is not None:
                    break
            elif not _exists(pid):
                break
            time.sleep(0.02)
        else:
            if pid and (self._proc is None or self._proc.poll() is None):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
                if self._proc is not None:
                    self._proc.wait(5)
        self._proc = None
        self.pidfile.unlink(missing_ok=True)


def _read_pid(path: pathlib.Path) -> int | None:
    try:
        return int(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def _exists(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"dsec.images.lazyfs" in f.read()
    except FileNotFoundError:
        return False
