"""``make test-cgroup2``: run dsec's container and density tests in a guest that has only
cgroup v2, with real runc.

Hosts here are hybrid (v1 controllers and an empty v2 tree), production hosts are v2 only;
this puts the v2 paths of ``node/host/cgroups.py`` and ``node/density/`` on a real kernel.

How: QEMU (``microvm`` machine; TCG, or KVM when asked) boots the Debian kernel that
``linux-image-amd64`` installs (the microvm guests' kernel) with ``cgroup_no_v1=all
systemd.unified_cgroup_hierarchy=1``. The guest's root is the host's own root filesystem,
shared read-only over virtio-9p with a tmpfs overlay on top: the guest sees this checkout,
the venv, runc, busybox and the kernel's modules at the same paths as the host, and writes
nothing back. A second, writable 9p share (a temporary directory) carries the pytest
arguments in and the exit status out. The guest's init mounts cgroup2 alone on
``/sys/fs/cgroup``, refuses to go on unless ``stat -fc %T`` says ``cgroup2fs``, runs pytest
(its output is the guest's console, printed here as it comes) and powers off.

    python -m tests.support.cgroup2_guest [pytest args...]

Exit status: pytest's inside the guest; 3 when the guest never reported one.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dsec.node.backends.microvm.guest import (BUSYBOX, _Cpio, _kernel_version, _load_order,
                                             _module_graph, extract_vmlinux)
from dsec.node.backends.microvm.qemu import base_kernel_words

__all__ = ["DEFAULT_TESTS", "build", "main", "run"]

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / "build" / "cgroup2-guest"
BUILD_VERSION = "1"
# What the initramfs needs to reach the shared root; the rest loads from the root itself.
MODULES = ["virtio_mmio", "9pnet_virtio", "9p", "overlay", "virtio_rng"]
# The focused set: container lifecycle, limits and isolation, the warm pool's limits on an
# adopted sandbox, and the density tests, on real runc. Left to the host: what no cgroup
# touches (exec output buffering, a deep state dir's socket path: the slowest here), and
# KSM (PR_SET_MEMORY_MERGE needs kernel >= 6.4; the guest's Debian kernel is 6.1).
DEFAULT_TESTS = [
    "tests/node/host/test_cgroups.py",
    "tests/node/test_lifecycle.py",
    "--deselect",
    "tests/node/test_lifecycle.py::test_a_deep_state_dir_still_reaches_the_agent",
    "tests/node/test_limits.py",
    "--deselect", "tests/node/test_limits.py::test_streamed_exec_is_not_buffered",
    "--deselect", "tests/node/test_limits.py::test_large_output_exec_keeps_the_server_bounded",
    "tests/node/test_isolation.py",
    "tests/node/test_pool.py::test_create_takes_a_pooled_sandbox_with_its_own_limits",
    "tests/node/test_density.py",
    "--deselect", "tests/node/test_density.py::test_container_processes_are_offered_to_ksm",
]
EXIT_MARK = "dsec-cgroup2-exit="

INIT = r"""#!/bin/sh
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
fail() { echo "cgroup2-guest: FAILED: $*"; poweroff -f; sleep 5; }
for m in $(cat /etc/modules); do insmod /lib/modules/$m.ko || fail "insmod $m"; done
mkdir -p /lower /upper /newroot
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=524288 root /lower \
  || fail "mount the shared root"
mount -t tmpfs -o mode=0755 tmpfs /upper && mkdir /upper/u /upper/w
mount -t overlay overlay -o lowerdir=/lower,upperdir=/upper/u,workdir=/upper/w /newroot \
  || fail "overlay on the shared root"
mkdir -p /newroot/mnt/cgroup2-guest
mount -t 9p -o trans=virtio,version=9p2000.L,cache=none out /newroot/mnt/cgroup2-guest \
  || fail "mount the out share"
mount --move /dev /newroot/dev; mount --move /proc /newroot/proc; mount --move /sys /newroot/sys
exec switch_root /newroot /bin/sh /mnt/cgroup2-guest/stage2
"""

# Runs as PID 1 on the overlay root.
STAGE2 = r"""export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8
out=/mnt/cgroup2-guest
fail() { echo "cgroup2-guest: FAILED: $*"; echo 3 > $out/rc; sync; poweroff -f; sleep 5; }
mount -t tmpfs -o mode=0755 tmpfs /run
mount -t tmpfs -o mode=1777 tmpfs /tmp
mkdir -p /dev/pts /dev/shm
mount -t devpts -o newinstance,ptmxmode=0666 devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup || fail "mount cgroup2"
fs=$(stat -fc %T /sys/fs/cgroup)
echo "cgroup2-guest: stat -fc %T /sys/fs/cgroup = $fs; kernel $(uname -r)"
[ "$fs" = cgroup2fs ] || fail "/sys/fs/cgroup is $fs, not cgroup2fs"
awk '$3 == "cgroup" {f=1} END {exit !f}' /proc/mounts && fail "a cgroup v1 hierarchy is mounted"
for m in loop erofs overlay zram fuse; do modprobe $m || fail "modprobe $m"; done
ip link set lo up
hostname cgroup2-guest
ulimit -n 1048576
# the checkout has a share of its own: it may sit on a filesystem the root share does not
# cross (a tmpfs /tmp, another disk); a tmpfs overlay keeps the guest's writes in the guest
ck="$(cat $out/cwd)"
mkdir -p /run/ck/lower /run/ck/upper "$ck"
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=524288 checkout /run/ck/lower \
  || fail "mount the checkout share"
mount -t tmpfs tmpfs /run/ck/upper && mkdir /run/ck/upper/u /run/ck/upper/w
mount -t overlay overlay -o lowerdir=/run/ck/lower,upperdir=/run/ck/upper/u,workdir=/run/ck/upper/w "$ck" \
  || fail "overlay on the checkout"
cd "$ck" || fail "no checkout"
echo "cgroup2-guest: $(cat $out/python) -m pytest $(cat $out/args)"
eval "set -- $(cat $out/args)"
PYTHONPATH="$PWD/src" PYTHONDONTWRITEBYTECODE=1 "$(cat $out/python)" -m pytest "$@"
rc=$?
echo "%(mark)s$rc"
echo $rc > $out/rc
sync
poweroff -f
""".replace("%(mark)s", EXIT_MARK)


def build(cache: Path = CACHE, modules_root: Path = Path("/lib/modules"),
          boot_dir: Path = Path("/boot")) -> tuple[Path, Path, str]:
    """The guest kernel (uncompressed ELF when it can be extracted: no decompression under
    TCG) and initramfs, built once per input under ``cache``; returns (kernel, initrd,
    kernel version)."""
    kver = _kernel_version(modules_root)
    bz = boot_dir / f"vmlinuz-{kver}"
    if not bz.exists():
        raise SystemExit(f"no guest kernel {bz}: apt-get install linux-image-amd64")
    mods = _load_order(_module_graph(kver, modules_root), MODULES, kver, modules_root)
    h = hashlib.sha256((BUILD_VERSION + INIT).encode())
    for p in [bz, BUSYBOX, *(p for _, p in mods)]:
        h.update(f"{p}:{p.stat().st_size}:{p.stat().st_mtime_ns}".encode())
    dest = cache / f"{kver}-{h.hexdigest()[:12]}"
    kernel, initrd = dest / "vmlinux", dest / "initramfs.cpio"
    if initrd.exists():
        return (kernel if kernel.exists() else bz), initrd, kver
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=cache))
    elf = extract_vmlinux(bz.read_bytes())
    if elf is not None:
        (tmp / "vmlinux").write_bytes(elf)
    c = _Cpio()
    for d in ["bin", "dev", "etc", "lib", "lib/modules", "proc", "sys", "newroot"]:
        c.dir(d)
    c.file("bin/busybox", BUSYBOX.read_bytes(), 0o755)
    for applet in ["sh", "mount", "insmod", "cat", "mkdir", "sleep", "poweroff", "echo",
                   "switch_root"]:
        c.symlink(f"bin/{applet}", "busybox")
    for name, path in mods:
        c.file(f"lib/modules/{name}.ko", path.read_bytes())
    c.file("etc/modules", "".join(f"{n}\n" for n, _ in mods).encode())
    c.file("init", INIT.encode(), 0o755)
    (tmp / "initramfs.cpio").write_bytes(c.finish())
    try:
        os.rename(tmp, dest)
    except OSError:  # built meanwhile by another run
        shutil.rmtree(tmp, ignore_errors=True)
    return (kernel if kernel.exists() else bz), initrd, kver


def qemu_argv(kernel: Path, initrd: Path, out: Path, memory_mb: int, vcpus: int,
              accel: str) -> list[str]:
    """QEMU's command line: the shared root, the out share, a console on stdout."""
    words = [*base_kernel_words(accel), "cgroup_no_v1=all", "systemd.unified_cgroup_hierarchy=1",
             "psi=1", "rdinit=/init"]
    return ["qemu-system-x86_64", "-M", "microvm,acpi=on,pcie=off,rtc=on",
            "-accel", "tcg,thread=multi" if accel == "tcg" else "kvm",
            "-cpu", "max" if accel == "tcg" else "host",
            "-m", str(memory_mb), "-smp", str(vcpus), "-nodefaults", "-no-user-config",
            "-display", "none", "-serial", "stdio", "-no-reboot",
            "-kernel", str(kernel), "-initrd", str(initrd), "-append", " ".join(words),
            "-fsdev", "local,id=root,path=/,security_model=passthrough,readonly=on,"
                      "multidevs=remap",
            "-device", "virtio-9p-device,fsdev=root,mount_tag=root",
            "-fsdev", f"local,id=checkout,path={ROOT},security_model=passthrough,readonly=on,"
                      "multidevs=remap",
            "-device", "virtio-9p-device,fsdev=checkout,mount_tag=checkout",
            "-fsdev", f"local,id=out,path={out},security_model=passthrough",
            "-device", "virtio-9p-device,fsdev=out,mount_tag=out",
            "-device", "virtio-rng-device"]


def _die_with_parent() -> None:
    """In QEMU's child before exec: SIGKILL when this process dies (even by SIGKILL)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def run(pytest_args: list[str], memory_mb: int = 3072, vcpus: int = 2, accel: str = "tcg",
        timeout_s: float = 1800.0) -> int:
    """Boot the guest, run pytest in it, return its exit status (3: none reported)."""
    kernel, initrd, kver = build()
    out = Path(tempfile.mkdtemp(prefix="dsec-cgroup2-"))
    try:
        (out / "stage2").write_text(STAGE2)
        (out / "cwd").write_text(str(ROOT))
        (out / "python").write_text(sys.executable)
        (out / "args").write_text(shlex.join(pytest_args))
        argv = qemu_argv(kernel, initrd, out, memory_mb, vcpus, accel)
        print(f"cgroup2-guest: booting kernel {kver} ({accel}, {vcpus} vCPUs, "
              f"{memory_mb} MiB)", flush=True)
        start = time.monotonic()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            print(f"cgroup2-guest: no result after {timeout_s:.0f}s; stopping the guest")
        finally:  # timed out, interrupted, or done: no QEMU outlives this run
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        rc_file = out / "rc"
        rc = int(rc_file.read_text()) if rc_file.exists() else 3
        print(f"cgroup2-guest: exit {rc} after {time.monotonic() - start:.0f}s", flush=True)
        return rc
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """Command line: the options below, then pytest's arguments (default: ``-q`` and
    :data:`DEFAULT_TESTS`)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--memory-mb", type=int, default=3072)
    ap.add_argument("--vcpus", type=int, default=2)
    ap.add_argument("--accel", choices=["tcg", "kvm"], default="tcg")
    a, rest = ap.parse_known_args(argv)
    args = rest or ["-q", "-p", "no:cacheprovider", *DEFAULT_TESTS]
    return run(args, a.memory_mb, a.vcpus, a.accel)


if __name__ == "__main__":
    sys.exit(main())
