"""Can a backend enforce a sandbox's protected paths? Asked at create, never per command.

The in-sandbox agent enforces them with Landlock (``agent/protect.h``) in whatever kernel
runs the commands: the host's for containers, the guest's for microvm and vm. A backend
says which with a ``protects_paths`` attribute ("host" or "guest"); one without it cannot.
"""

from __future__ import annotations

import ctypes
import functools

from dsec.api.errors import Unsupported

__all__ = ["landlock_abi", "check_protection"]

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
