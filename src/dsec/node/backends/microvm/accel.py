"""KVM or TCG: decided by booting a guest once, remembered per node.

``/dev/kvm`` existing proves little: under nested virtualisation it can open and then never
run a guest. So the probe boots the real guest kernel with ``dsec.bare=1`` (print a marker,
power off) under KVM with a short timeout; no marker means TCG. The answer is cached in
``accel.json`` in the given cache directory, keyed by host kernel and QEMU binary, so a
node probes once.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Literal

from dsec.node.backends.microvm.guest import GuestArtifacts
from dsec.node.backends.microvm.qemu import base_kernel_words

__all__ = ["detect_accel", "BARE_MARKER"]

BARE_MARKER = b"dsec-bare-boot-ok"
Accel = Literal["kvm", "tcg"]


def bare_boot_argv(qemu: str, art: GuestArtifacts, accel: Accel) -> list[str]:
    """A guest that boots the kernel and initramfs, prints the marker and powers off."""
    return [qemu, "-M", "microvm,acpi=on,pcie=off", "-accel", accel,
            "-cpu", "host" if accel == "kvm" else "max", "-m", "128", "-smp", "1",
            "-nodefaults", "-no-user-config", "-display", "none", "-serial", "stdio",
            "-no-reboot", "-kernel", str(art.kernel), "-initrd", str(art.initrd),
            "-append", " ".join([*base_kernel_words(accel), "dsec.bare=1"])]


async def bare_boot(qemu: str, art: GuestArtifacts, accel: Accel, timeout: float) -> bool:
    """True when the bare guest printed its marker within ``timeout`` seconds."""
    proc = await asyncio.create_subprocess_exec(
        *bare_boot_argv(qemu, art, accel), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        return False
    return BARE_MARKER in out


def _cache_key(qemu: str) -> str:
    return f"{os.uname().release}|{qemu}"


async def detect_accel(cache_dir: Path, qemu: str, art: GuestArtifacts,
                       timeout: float = 15.0) -> Accel:
    """``"kvm"`` if a KVM guest really boots on this node, else ``"tcg"``; cached."""
    cache = Path(cache_dir) / "accel.json"
    try:
        saved = json.loads(cache.read_text())
        if saved.get("key") == _cache_key(qemu) and saved.get("accel") in ("kvm", "tcg"):
            return saved["accel"]
    except (OSError, ValueError):
        pass
    accel: Accel = "tcg"
    if os.access("/dev/kvm", os.R_OK | os.W_OK) and await bare_boot(qemu, art, "kvm", timeout):
        accel = "kvm"
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"key": _cache_key(qemu), "accel": accel}))
    os.replace(tmp, cache)
    return accel
