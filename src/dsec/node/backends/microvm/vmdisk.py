"""Builds a bootable disk for the vm backend from an image in the layer store.

The disk is an MBR disk with one ext4 partition holding the image's files (its layers
flattened), a kernel and initramfs in ``/boot``, the extlinux boot loader, and dsec's guest
pieces in ``/.dsec`` (agent, busybox, network setup). The guest's own ``/sbin/init`` starts
the agent: busybox init through ``/etc/inittab``, systemd through a unit. The result is a
qcow2 shared read-only as the backing file of every sandbox's own qcow2.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from dsec.api.errors import Internal
from dsec.node.backends.microvm.guest import BUSYBOX, GuestArtifacts, confinement_program

__all__ = ["build_vm_disk", "MBR_CANDIDATES"]

MBR_CANDIDATES = [Path("/usr/lib/syslinux/mbr/mbr.bin"), Path("/usr/lib/SYSLINUX/mbr.bin")]
PART_OFFSET = 1 << 20

AGENT_UP = """#!/.dsec/busybox sh
# dsec: bring up the network (QEMU user networking) and serve the agent on its port.
B=/.dsec/busybox
$B ip link set lo up
$B ip addr add 10.0.2.15/24 dev eth0 2>/dev/null
$B ip link set eth0 up
$B ip route add default via 10.0.2.2 2>/dev/null
$B mountpoint -q /sys || $B mount -t sysfs sysfs /sys
for i in $($B seq 50); do
  for p in /sys/class/virtio-ports/*; do
    # the agent is the init of a pid namespace of its own: its commands cannot signal it
    [ "$($B cat $p/name 2>/dev/null)" = dsec.agent ] && exec $B unshare -m -p -f --mount-proc \
      /.dsec/agent --confine /.dsec/seccomp.bpf serve-serial /dev/${p##*/}
  done
  $B sleep 0.1
done
echo "dsec: no agent port" >&2; exit 1
"""

INITTAB = """::sysinit:/.dsec/busybox mount -t proc proc /proc
::sysinit:/.dsec/busybox mount -o remount,rw /
::sysinit:/.dsec/busybox mkdir -p /dev/pts /tmp
::sysinit:/.dsec/busybox mount -t devpts devpts /dev/pts
::respawn:/.dsec/agent-up
tty1::respawn:/.dsec/agent --confine /.dsec/seccomp.bpf run /.dsec/busybox sh -l
::ctrlaltdel:/.dsec/busybox poweroff -f
"""

UNIT = """[Unit]
Description=dsec guest agent
After=local-fs.target

[Service]
ExecStart=/.dsec/agent-up
Restart=always

[Install]
WantedBy=multi-user.target
"""


def _run(*argv: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise Internal(f"{argv[0]} failed building the vm disk: {proc.stderr[-800:]}")


def _flatten(lowerdirs: list[Path], dest: Path, work: Path) -> None:
    """Copy the merged view of read-only layer dirs (top first) into ``dest``."""
    if len(lowerdirs) == 1:
        _run("cp", "-a", f"{lowerdirs[0]}/.", str(dest))
        return
    mnt = work / "merged"
    mnt.mkdir()
    _run("mount", "-t", "overlay", "overlay", "-o",
         "ro,lowerdir=" + ":".join(str(p) for p in lowerdirs), str(mnt))
    try:
        _run("cp", "-a", f"{mnt}/.", str(dest))
    finally:
        _run("umount", str(mnt))


def _stage(root: Path, art: GuestArtifacts, agent: Path, kernel_args: str) -> None:
    for d in ["boot/extlinux", ".dsec", "etc/systemd/system/multi-user.target.wants",
              "proc", "sys", "dev", "tmp", "sbin"]:
        (root / d).mkdir(parents=True, exist_ok=True)
    shutil.copyfile(art.bzimage, root / "boot/vmlinuz")
    shutil.copyfile(art.initrd, root / "boot/initrd.img")
    shutil.copyfile(agent, root / ".dsec/agent")
    shutil.copyfile(BUSYBOX, root / ".dsec/busybox")
    (root / ".dsec/agent-up").write_text(AGENT_UP)
    (root / ".dsec/seccomp.bpf").write_bytes(confinement_program())
    for f in ("agent", "busybox", "agent-up"):
        os.chmod(root / ".dsec" / f, 0o755)
    if not os.path.lexists(root / "sbin/init"):
        os.symlink("/.dsec/busybox", root / "sbin/init")
    (root / "etc/inittab").write_text(INITTAB)
    (root / "etc/systemd/system/dsec-agent.service").write_text(UNIT)
    wants = root / "etc/systemd/system/multi-user.target.wants/dsec-agent.service"
    if not os.path.lexists(wants):
        os.symlink("/etc/systemd/system/dsec-agent.service", wants)
    (root / "boot/extlinux/extlinux.conf").write_text(
        "DEFAULT dsec\nPROMPT 0\nTIMEOUT 1\nLABEL dsec\n  LINUX /boot/vmlinuz\n"
        "  INITRD /boot/initrd.img\n"
        f"  APPEND dsec.root=disk console=tty0 {kernel_args}\n")


def build_vm_disk(out_dir: Path, lowerdirs: list[Path], key_parts: list[str],
                  art: GuestArtifacts, agent: Path, kernel_args: str,
                  size_mb: int = 1024) -> Path:
    """The bootable qcow2 for an image (its layer mounts, top first); built once per key."""
    mbr = next((p for p in MBR_CANDIDATES if p.exists()), None)
    if mbr is None or shutil.which("extlinux") is None:
        raise Internal("the vm backend needs extlinux: apt-get install extlinux syslinux-common")
    key = hashlib.sha256("|".join([*key_parts, str(art.initrd), kernel_args, str(size_mb),
                                   AGENT_UP, INITTAB]).encode()).hexdigest()[:16]
    disk = Path(out_dir) / f"{key}.qcow2"
    if disk.exists():
        return disk
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="vmdisk-", dir=out_dir))
    try:
        root = work / "root"
        root.mkdir()
        _flatten(lowerdirs, root, work)
        _stage(root, art, agent, kernel_args)
        part = work / "part.img"
        with open(part, "wb") as f:
            f.truncate((size_mb << 20) - PART_OFFSET)
        # extlinux 6.04 fails to load kernels from the ext4 of current mke2fs defaults;
        # ext2 it reads (and the guest's ext4 driver mounts it).
        _run("mkfs.ext2", "-q", "-F", "-d", str(root), "-L", "dsec-root", str(part))
        mnt = work / "mnt"
        mnt.mkdir()
        _run("mount", "-o", "loop", str(part), str(mnt))
        try:
            _run("extlinux", "--install", str(mnt / "boot/extlinux"))
        finally:
            _run("umount", str(mnt))
        raw = work / "disk.raw"
        with open(raw, "wb") as f:
            f.truncate(size_mb << 20)
        sfdisk = subprocess.run(["sfdisk", "-q", str(raw)], capture_output=True, text=True,
                                input=f"start={PART_OFFSET // 512}, type=83, bootable\n")
        if sfdisk.returncode != 0:
            raise Internal(f"sfdisk failed building the vm disk: {sfdisk.stderr[-500:]}")
        with open(raw, "r+b") as f:
            f.write(mbr.read_bytes()[:440])  # boot code only: the partition table follows
        _run("dd", f"if={part}", f"of={raw}", "bs=1M", "seek=1", "conv=notrunc,sparse",
             "status=none")
        tmp = work / "disk.qcow2"
        _run("qemu-img", "convert", "-q", "-O", "qcow2", str(raw), str(tmp))
        os.chmod(tmp, 0o444)
        os.replace(tmp, disk)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return disk
