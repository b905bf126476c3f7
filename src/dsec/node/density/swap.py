"""The swap a node reclaims into: a zram device by default, optionally a swap file.

The node sets up only what is missing. A swap area it makes carries the label
:data:`LABEL`, so a restarted node, or another node on the host, uses it instead of adding
another. Every node that uses a dsec area holds a shared lock on a file of its own for it
(under ``run_dir``; the kernel drops a killed node's lock with it), and the node closing
last, with no sandbox of its own left (a sandbox outlives its node, and its pages may sit in
that swap), removes the area, whoever made it: so a node killed and started again on its
state dir, or a node that found the area an earlier one left, does not leave it behind.
``swapoff`` first brings back whatever is still in it (it fails, and the area stays, when
RAM cannot take it). Swap there already that is not dsec's (the host's own) counts towards
the size wanted and is never touched.
"""

from __future__ import annotations

import fcntl
import logging
import os
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

from dsec.node.density.config import SwapConfig

__all__ = ["LABEL", "SwapArea", "SwapManager", "SwapStatus", "read_swaps", "swap_label"]

log = logging.getLogger("dsec.node.density")
LABEL = "dsec-swap"
MIN_ZRAM = 64 << 20  # less than this is not worth a device
_LABEL_AT = 1024 + 4 + 4 + 4 + 16  # swap header: bootbits, version, last_page, nr_bad, uuid


@dataclass(frozen=True)
class SwapArea:
    """One line of /proc/swaps."""

    path: str
    kind: str
    size: int   # bytes
    used: int   # bytes
    priority: int


@dataclass(frozen=True)
class SwapStatus:
    """The node's swap: total and free over every area, and which areas are dsec's."""

    total: int = 0
    free: int = 0
    areas: tuple[SwapArea, ...] = ()
    ours: tuple[str, ...] = ()
    note: str = ""


def read_swaps(proc_swaps: Path = Path("/proc/swaps")) -> list[SwapArea]:
    out = []
    try:
        lines = proc_swaps.read_text().splitlines()[1:]
    except OSError:
        return out
    for line in lines:
        parts = line.split()
        if len(parts) >= 5:
            path = parts[0].replace("\\040", " ")
            out.append(SwapArea(path, parts[1], int(parts[2]) << 10, int(parts[3]) << 10,
                                int(parts[4])))
    return out


def swap_label(path: str) -> str:
    """The label in a swap area's header (``mkswap -L``), '' when unreadable."""
    try:
        with open(path, "rb") as f:
            f.seek(_LABEL_AT)
            return f.read(16).split(b"\0")[0].decode(errors="replace")
    except OSError:
        return ""


def _run(*argv: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise OSError(f"{argv[0]} failed: {proc.stderr.strip() or proc.stdout.strip()}")


@dataclass
class SwapManager:
    """Sets up and tears down the node's swap. ``sys``, ``proc_swaps`` and ``run`` are the
    host's by default (tests give fake ones)."""

    config: SwapConfig
    sys: Path = Path("/sys")
    proc_swaps: Path = Path("/proc/swaps")
    run: object = _run
    dev: Path = Path("/dev")
    run_dir: Path = Path("/run/dsec/swap")  # a lock file per dsec area its users hold
    made: list[str] = field(default_factory=list)   # areas this manager set up
    found: list[str] = field(default_factory=list)  # dsec areas it found and uses
    note: str = ""
    holds: dict[str, int] = field(default_factory=dict)  # area -> fd of its shared lock

    def wanted(self, host_mem: int) -> int:
        zram = self.config.zram_mb
        zram_bytes = host_mem // 2 if zram is None else zram << 20
        return zram_bytes + (self.config.file_mb << 20 if self.config.file else 0)

    def ensure(self, host_mem: int) -> SwapStatus:
        """Add the zram device and swap file the config asks for, unless enough swap (a
        dsec area left by an earlier run, the host's own) is already there."""
        with _LOCK:
            areas = read_swaps(self.proc_swaps)
            ours = [a.path for a in areas if swap_label(a.path) == LABEL]
            for path in ours:
                if path in _SHARED:  # made by another node of this process
                    _SHARED[path] += 1
                    self.made.append(path)
                else:
                    self.found.append(path)
                self._hold(path)
            have, want = sum(a.size for a in areas), self.wanted(host_mem)
            if have >= want:
                log.info("swap: %d MiB present (%s); nothing added", have >> 20,
                         ", ".join(a.path for a in areas) or "none wanted")
                return self.status()
            if self.config.zram_mb != 0:
                size = host_mem // 2 if self.config.zram_mb is None else self.config.zram_mb << 20
                # a dsec zram already there counts; a smaller one than asked for gets a
                # second device for the rest (a 12 GiB one left by an earlier node capped
                # a run that asked for 64 GiB)
                size -= sum(a.size for a in areas if a.path in ours and "zram" in a.path)
                if size >= MIN_ZRAM:
                    self._add_zram(size)
            if self.config.file and self.config.file_mb and \
                    str(self.config.file) not in {a.path for a in areas}:
                self._add_file(self.config.file, self.config.file_mb << 20)
            return self.status()

    def _add_zram(self, size: int) -> None:
        control = self.sys / "class" / "zram-control" / "hot_add"
        if not control.exists():
            self.note = ("no zram here (no /sys/class/zram-control: the kernel lacks the "
                         "zram module); pause freezes without reclaiming into zram")
            log.warning("swap: %s", self.note)
            return
        num = control.read_text().strip()  # reading hot_add makes a new device
        name = f"zram{num}"
        block = self.sys / "block" / name
        try:
            if self.config.zram_algorithm:
                (block / "comp_algorithm").write_text(self.config.zram_algorithm)
            (block / "disksize").write_text(str(size))
            path = str(self.dev / name)
            self.run("mkswap", "-L", LABEL, path)
            self.run("swapon", "-p", "100", path)  # before any disk swap
        except OSError as exc:
            self.note = f"could not set up {name}: {exc}"
            log.warning("swap: %s", self.note)
            self._remove_zram(name)
            return
        self.made.append(path)
        _SHARED[path] = _SHARED.get(path, 0) + 1
        self._hold(path)
        log.info("swap: added %s, %d MiB of compressed swap", path, size >> 20)

    def _add_file(self, path: Path, size: int) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o600)
            try:
                os.posix_fallocate(fd, 0, size)
            finally:
                os.close(fd)
            self.run("mkswap", "-L", LABEL, str(path))
            self.run("swapon", "-p", "-2", str(path))
        except OSError as exc:
            self.note = f"could not set up swap file {path}: {exc}"
            log.warning("swap: %s", self.note)
            path.unlink(missing_ok=True)
            return
        self.made.append(str(path))
        _SHARED[str(path)] = _SHARED.get(str(path), 0) + 1
        self._hold(str(path))
        log.info("swap: added swap file %s, %d MiB", path, size >> 20)

    def release(self, keep: bool) -> None:
        """This node is done with swap. A dsec area it used (made or found) goes when no
        other node uses it, unless ``keep`` (sandboxes of this node remain that may sit in
        it)."""
        with _LOCK:
            for path in self.made + self.found:
                if path in self.made:
                    _SHARED[path] = _SHARED.get(path, 1) - 1
                    if _SHARED[path] > 0:  # another node of this process still uses it
                        self._unhold(path)
                        continue
                    del _SHARED[path]
                if keep or not self._last_user(path):
                    self._unhold(path)
                    continue
                try:
                    self.run("swapoff", path)
                except OSError as exc:  # e.g. no RAM to take its pages back: leave it
                    log.warning("swap: could not remove %s: %s", path, exc)
                    self._unhold(path)
                    continue
                if Path(path).name.startswith("zram") and path.startswith(str(self.dev)):
                    self._remove_zram(Path(path).name)
                else:
                    Path(path).unlink(missing_ok=True)
                self._lock_file(path).unlink(missing_ok=True)
                self._unhold(path)
                log.info("swap: removed %s", path)
            self.made.clear()
            self.found.clear()

    def _lock_file(self, path: str) -> Path:
        return self.run_dir / (path.strip("/").replace("/", "_") + ".lock")

    def _hold(self, path: str) -> None:
        """Say, for as long as this process lives or until release, that this node uses
        ``path``."""
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(self._lock_file(path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            log.warning("swap: no lock for %s (%s): it will be left in place", path, exc)
            return
        fcntl.flock(fd, fcntl.LOCK_SH)
        self.holds[path] = fd

    def _last_user(self, path: str) -> bool:
        """True when no other node holds ``path`` (this one's lock becomes exclusive)."""
        fd = self.holds.get(path)
        if fd is None:
            return False  # cannot tell: leave it
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def _unhold(self, path: str) -> None:
        fd = self.holds.pop(path, None)
        if fd is not None:
            os.close(fd)

    def _remove_zram(self, name: str) -> None:
        try:
            (self.sys / "block" / name / "reset").write_text("1")
            (self.sys / "class" / "zram-control" / "hot_remove").write_text(name[4:])
        except OSError as exc:
            log.warning("swap: could not remove %s: %s", name, exc)

    def status(self) -> SwapStatus:
        areas = tuple(read_swaps(self.proc_swaps))
        total = sum(a.size for a in areas)
        return SwapStatus(total=total, free=total - sum(a.used for a in areas), areas=areas,
                          ours=tuple(self.made + self.found), note=self.note)


_LOCK = threading.Lock()
_SHARED: dict[str, int] = {}  # area -> nodes of this process using it
