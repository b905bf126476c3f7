"""Can a backend enforce a sandbox's protected paths? Asked at create, never per command.

The in-sandbox agent enforces them with Landlock (``agent/protect.h``) in whatever kernel
runs the commands: the host's for containers, the guest's for microvm and vm. A backend
says which with a ``protects_paths`` attribute: "host", or a method that raises
``Unsupported`` when its guest kernel cannot; a backend without it cannot.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

from dsec.api.errors import Unsupported

__all__ = ["landlock_abi", "check_protection", "config_has_landlock", "check_guest_kernel"]

_SYS_LANDLOCK_CREATE_RULESET = 444  # x86_64 and the generic table alike
_LANDLOCK_CREATE_RULESET_VERSION = 1


@functools.cache
def landlock_abi() -> int:
    """This kernel's Landlock ABI version; 0 when Landlock is absent or not enabled."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    v = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                     ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION))
    return max(int(v), 0)


def check_protection(backend: object, name: str) -> None:
    """Raise :class:`Unsupported` when ``backend`` cannot keep protected paths."""
    where = getattr(backend, "protects_paths", None)
    if where is None:
        raise Unsupported(f"protected_paths are not supported by the {name} backend; use "
                          "backend='container' (or microvm/vm where the guest kernel has "
                          "Landlock)")
    if where == "host" and landlock_abi() < 1:
        raise Unsupported("protected_paths need Landlock in this node's kernel "
                          "(CONFIG_SECURITY_LANDLOCK with 'landlock' in its lsm= list); "
                          "it has none: create the sandbox without protected_paths")
    if callable(where):
        where()  # a backend that checks itself (a guest kernel), raising Unsupported


def config_has_landlock(config: str, cmdline: str = "") -> bool:
    """Does a kernel built with ``config`` (its /boot/config-* text) and booted with
    ``cmdline`` run Landlock? Built in, and in the LSM list (``lsm=`` overrides it)."""
    opts = dict(line.split("=", 1) for line in config.splitlines()
                if line.startswith("CONFIG_") and "=" in line)
    if opts.get("CONFIG_SECURITY_LANDLOCK") != "y":
        return False
    lsm = opts.get("CONFIG_LSM", "").strip('"')
    for word in cmdline.split():
        if word.startswith("lsm="):
            lsm = word.removeprefix("lsm=")
    return "landlock" in lsm.split(",")


def check_guest_kernel(modules_root: Path = Path("/lib/modules"), boot_dir: Path = Path("/boot"),
                       cmdline: str = "") -> None:
    """Raise :class:`Unsupported` unless the guest kernel (the newest installed one, as the
    microvm guest build picks) runs Landlock."""
    from dsec.node.backends.microvm.guest import _kernel_version
    kver = _kernel_version(modules_root)
    try:
        config = (boot_dir / f"config-{kver}").read_text()
    except OSError:
        config = ""
    if not config_has_landlock(config, cmdline):
        raise Unsupported(f"protected_paths need Landlock in the guest kernel; {kver} does not "
                          "run it (CONFIG_SECURITY_LANDLOCK and 'landlock' in its LSM list): "
                          "use backend='container' or create without protected_paths")
