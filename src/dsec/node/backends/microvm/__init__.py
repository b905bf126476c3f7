"""The microvm and vm backends: sandboxes as QEMU guests with their own kernel.

``MicroVMBackend`` boots dsec's initramfs and the Debian kernel on QEMU's ``microvm``
machine over the image's EROFS layers; ``VMBackend`` boots a whole disk image on ``q35``.
Both run the same dsec-agent as containers, reached over a multiplexed virtio-serial
port.

Names are imported on first use, so ``python -m dsec.node.backends.microvm.guest`` (the
artefact build) does not load the backends first.
"""

from __future__ import annotations

import importlib

__all__ = ["MicroVMBackend", "MicroVMConfig", "VMBackend"]

_WHERE = {"MicroVMBackend": "backend", "MicroVMConfig": "config", "VMBackend": "vm"}


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
