"""Node-level settings of the microvm and vm backends (``NodeConfig.guests``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["MicroVMConfig"]


class MicroVMConfig(BaseModel):
    """Node-level settings of the microvm backend."""

    model_config = ConfigDict(extra="forbid")

    qemu: str = Field("qemu-system-x86_64", description="QEMU binary")
    accel: Literal["auto", "kvm", "tcg"] = Field(
        "auto", description="auto: KVM if a probe guest boots under it, else TCG")
    boot_timeout_s: float = Field(120.0, gt=0,
                                  description="a guest whose agent is silent this long fails")
    console_log_bytes: int = Field(1 << 20, ge=4096, description="cap of console.log")
    ksm: bool = Field(True, description="turn on the host's KSM so guests share equal pages")
    pause_to_disk: bool = Field(False, description="pause saves the guest to disk, ends QEMU")
    warm_start: bool = Field(False, description="start sandboxes as clones of a saved, booted "
                                                "template per image and size (booted once)")
    guest_dir: Path | None = Field(None, description="guest kernel/initramfs cache (and the "
                                                     "KVM probe's answer); default "
                                                     "<state>/microvm/guest")
    kernel_args: str = Field("", description="extra guest kernel command line words")
    uncompressed_kernel: bool = Field(
        True, description="boot the kernel's extracted ELF through PVH: about 2.5 s faster "
                          "under TCG; QEMU maps the ~60 MiB file, shared by all guests")
