"""The microvm and vm backends: sandboxes as QEMU guests with their own kernel.

``MicroVMBackend`` boots dsec's initramfs and the Debian kernel on QEMU's ``microvm``
machine over the image's EROFS layers; ``VMBackend`` boots a whole disk image on ``q35``.
Both run the same dsec-agent as containers, reached over loopback TCP.
"""

from dsec.node.backends.microvm.backend import MicroVMBackend, MicroVMConfig
from dsec.node.backends.microvm.vm import VMBackend

__all__ = ["MicroVMBackend", "MicroVMConfig", "VMBackend"]
