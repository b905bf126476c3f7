"""Network namespaces kept in a file: made before the process that lives in them, kept
while that process is replaced (a guest saved to disk and restored), removed by the node.

A namespace made here is bind-mounted on a file (as ``ip netns`` does under its own
directory), so it outlives every process in it until :func:`remove` unmounts it. The node
reaches a loopback port inside it by creating its socket there (:func:`socket_in`): the
calling thread joins the namespace for the ``socket()`` call only, then goes back.
"""

from __future__ import annotations

import ctypes
import os
import socket
import subprocess
import threading
from pathlib import Path

from dsec.api.errors import Internal
from dsec.node.host.mounts import umount

__all__ = ["create", "remove", "socket_in", "nsenter_argv", "inode"]

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
_own: int | None = None  # an fd of the node's own network namespace, opened once
_own_lock = threading.Lock()


def create(path: Path) -> Path:
    """A new network namespace with loopback up, bound to ``path`` (made empty here)."""
    path.touch(exist_ok=True)
    proc = subprocess.run(["unshare", f"--net={path}", "ip", "link", "set", "lo", "up"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        remove(path)
        raise Internal(f"could not make a network namespace: {proc.stderr.strip()[-300:]}")
    return path


def remove(path: Path) -> None:
    """Unmount the namespace at ``path`` and delete the file; the kernel frees the
    namespace (and any veth end in it) once no process is left inside. Idempotent."""
    umount(path)
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def _setns(fd: int) -> None:
    setns = getattr(os, "setns", None)  # Python 3.12+
    if setns is not None:
        setns(fd, CLONE_NEWNET)
    elif _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def socket_in(path: Path, family: int = socket.AF_INET,
              kind: int = socket.SOCK_STREAM) -> socket.socket:
    """A socket that belongs to the namespace at ``path`` (it keeps it after creation)."""
    global _own
    with _own_lock:
        if _own is None:
            _own = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    target = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        _setns(target)
        try:
            return socket.socket(family, kind)
        finally:
            _setns(_own)  # the thread goes home even if socket() failed
    finally:
        os.close(target)


def nsenter_argv(path: Path) -> list[str]:
    """The command prefix that runs a program inside the namespace at ``path``."""
    return ["nsenter", f"--net={path}"]


def inode(path: Path | str) -> int:
    """The namespace's identity: equal for two paths that name the same namespace."""
    return os.stat(path).st_ino
