"""The vm backend: a full QEMU ``q35`` machine booting a disk built from an image.

The disk (see :mod:`.vmdisk`) carries its own kernel, boot loader and init, which starts
the same dsec-agent as every other backend. Each sandbox boots a qcow2 of its own over the
image's shared, read-only disk. The machine has a VGA display: :meth:`VMBackend.screenshot`
returns it as PNG, :meth:`VMBackend.type_text` and :meth:`VMBackend.click` drive its
keyboard and absolute pointer (for computer-use agents).
"""

from __future__ import annotations

import asyncio
import math
import struct
from pathlib import Path

from dsec.api.errors import Internal, Unsupported
from dsec.api.models import SandboxSpec
from dsec.images.models import LayerInfo
from dsec.node.agent.build import ensure_agent
from dsec.node.backends.base import SandboxRecord
from dsec.node.backends.microvm.snapshot import set_identity
from dsec.node.backends.microvm.backend import MicroVMBackend
from dsec.node.backends.microvm.keys import click_events, key_events, text_events
from dsec.node.backends.microvm.qemu import LaunchSpec, base_kernel_words
from dsec.node.backends.microvm.qmp import qmp, qmp_many
from dsec.node.backends.microvm.runtime import netns_path
from dsec.node.backends.microvm.vmdisk import build_vm_disk

__all__ = ["VMBackend"]


class VMBackend(MicroVMBackend):
    """Runs sandboxes as q35 guests booting their own disk; see the module docstring."""

    name = "vm"
    machine = "q35"

    async def launch_spec(self, s: SandboxSpec, d: Path,
                          hostname: str) -> tuple[LaunchSpec, dict]:
        art = await self.artifacts()
        accel = await self.accel()
        resolved = await asyncio.to_thread(self.images.resolve, s.image, s.layers)
        agent = self.agent_binary or await asyncio.to_thread(ensure_agent, self.guest_dir / "agent")
        args = " ".join([*base_kernel_words(accel), self.config.kernel_args])
        base = await asyncio.to_thread(
            build_vm_disk, self.state_dir / "vm" / "disks", resolved.lowerdirs,
            list(resolved.layer_digests), art, agent, args,
            max(1024, s.disk_mb))
        spec = LaunchSpec(qemu=self.config.qemu, machine="q35", accel=accel,
                          memory_mb=s.memory_mb, vcpus=max(1, math.ceil(s.cpu)), cpu=s.cpu,
                          boot_disk=d / "disk.qcow2", boot_base=base, workdir=d, display=True,
                          netns=netns_path(d),
                          hostname=hostname)
        facts = {"image_env": resolved.config.env, "image_cwd": resolved.config.cwd or "/",
                 "image_user": resolved.config.user or "root",
                 "layer_digests": list(resolved.layer_digests)}
        return spec, facts

    async def prepare_disks(self, spec: LaunchSpec, disk_mb: int) -> None:
        await _qemu_img_overlay(spec.boot_base, spec.boot_disk)

    async def _boot(self, spec: LaunchSpec, disk_mb: int) -> LaunchSpec:
        spec = await super()._boot(spec, disk_mb)
        # The disk is shared by every sandbox of the image: the name comes after boot.
        await set_identity(spec.workdir, spec.hostname)
        return spec

    async def pack_diff(self, rec: SandboxRecord, tag: str,
                        exclude: list[str] | None = None) -> LayerInfo:
        """A vm's disk is one whole filesystem with no layer of changes to pack."""
        raise Unsupported("pack_diff is not available on vm sandboxes (their disk has no "
                          "separate writable layer); use pause_to_disk to keep their state")

    # ---- display and input ----
    async def screenshot(self, rec: SandboxRecord) -> bytes:
        """The guest's display as PNG bytes."""
        d = self.sandbox_dir(rec.id)
        out = d / "screen.png"
        try:
            await qmp(d / "qmp.sock", "screendump", {"filename": str(out), "format": "png"})
            return await asyncio.to_thread(out.read_bytes)
        finally:
            out.unlink(missing_ok=True)

    async def type_text(self, rec: SandboxRecord, text: str) -> None:
        """Type ``text`` on the guest's keyboard (US layout; ``\\n`` is Enter)."""
        batches = text_events(text)
        sock = self.sandbox_dir(rec.id) / "qmp.sock"
        # One connection for the whole text; each character is its own event batch so the
        # guest sees distinct presses even when characters repeat, and a short pause
        # between them keeps the emulated PS/2 queue from overflowing on a slow guest.
        await qmp_many(sock, [("input-send-event", {"events": b}) for b in batches],
                       timeout=10.0 + len(batches) * 0.1, pause_s=0.02)

    async def press_keys(self, rec: SandboxRecord, keys: list[str]) -> None:
        """Press a chord of QEMU key codes, e.g. ``["ctrl", "c"]``."""
        await qmp(self.sandbox_dir(rec.id) / "qmp.sock", "input-send-event",
                  {"events": key_events(keys)})

    async def click(self, rec: SandboxRecord, x: int, y: int, button: str = "left") -> None:
        """Click at pixel (``x``, ``y``) of the current display."""
        width, height = png_size(await self.screenshot(rec))
        sock = self.sandbox_dir(rec.id) / "qmp.sock"
        await qmp_many(sock, [("input-send-event", {"events": b})
                              for b in click_events(x, y, width, height, button)])


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk."""
    if png[:8] != b"\x89PNG\r\n\x1a\n":
        raise Internal("QEMU's screendump is not a PNG")
    return struct.unpack(">II", png[16:24])


async def _qemu_img_overlay(base: Path, disk: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        "qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(base), str(disk),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise Internal(f"qemu-img create failed: {out.decode(errors='replace')[-500:]}")


