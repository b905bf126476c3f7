"""Network namespaces kept in a file: made before the process that lives in them, kept
while that process is replaced (a guest saved to disk and restored), removed by the node.

A namespace made here is bind-mounted on a file (as ``ip netns`` does under its own
directory), so it outlives every process in it until :func:`remove` unmounts it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from dsec.api.errors import Internal
from dsec.node.host.mounts import umount

__all__ = ["create", "remove", "nsenter_argv", "inode"]


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


def nsenter_argv(path: Path) -> list[str]:
    """The command prefix that runs a program inside the namespace at ``path``."""
    return ["nsenter", f"--net={path}"]


def inode(path: Path | str) -> int:
    """The namespace's identity: equal for two paths that name the same namespace."""
    return os.stat(path).st_ino
