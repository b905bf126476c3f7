"""Builds the microvm guest artefacts: the Debian kernel and a small initramfs.

The initramfs holds busybox (static), the dsec-agent, the virtio/overlay/erofs/ext4 modules
of the installed ``linux-image-amd64`` (in load order) and the ``/init`` script of
:mod:`guest_init`. Output goes to ``<out>/<key>/`` where ``key`` hashes every input, so a
second call is a lookup and a changed input gives a new directory::

    python -m dsec.node.backends.microvm.guest --out build/guest
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import io
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from dsec.api.errors import Internal
from dsec.node.agent.build import SOURCE as AGENT_SOURCE
from dsec.node.agent.build import ensure_agent
from dsec.node.backends.microvm.guest_init import INIT_SCRIPT

__all__ = ["GuestArtifacts", "ensure_guest", "MODULES"]

# What the guest needs; dependencies from modules.dep are added and ordered before each.
# crc32c_generic is only a soft dependency (of ext4, jbd2 and libcrc32c), hence listed.
MODULES = ["virtio_mmio", "virtio_pci", "virtio_blk", "virtio_net", "virtio_console",
           "crc32c_generic",
           "ext4", "erofs", "overlay", "virtio_input", "evdev", "virtio_balloon"]
BUSYBOX = Path("/usr/bin/busybox")
BUILD_VERSION = "3"
OPAQUE_SOURCE = Path(__file__).with_name("opaque.c")


class GuestArtifacts(BaseModel):
    """Paths of one built guest: what ``qemu -kernel/-initrd`` takes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kernel: Path = Field(description="the kernel QEMU loads directly: the uncompressed ELF "
                                     "(PVH entry) when it could be extracted, else the bzImage")
    bzimage: Path = Field(description="the distribution's compressed kernel (boot loaders)")
    initrd: Path = Field(description="the initramfs (newc cpio, uncompressed)")
    kernel_version: str = Field(description="uname -r of the guest kernel")


def _kernel_version(modules_root: Path) -> str:
    versions = sorted(p.name for p in modules_root.iterdir() if (p / "modules.dep").exists())
    if not versions:
        raise Internal("no guest kernel: apt-get install linux-image-amd64")
    return versions[-1]


def _mod_name(rel: str) -> str:
    return Path(rel).name.split(".ko")[0].replace("-", "_")


def _module_graph(kver: str, modules_root: Path) -> dict[str, tuple[Path, list[str]]]:
    """Module name -> (.ko path, names it depends on), from modules.dep."""
    out = {}
    root = modules_root / kver
    for line in (root / "modules.dep").read_text().splitlines():
        rel, _, deps = line.partition(":")
        out[_mod_name(rel)] = (root / rel, [_mod_name(d) for d in deps.split()])
    return out


def _load_order(graph: dict[str, tuple[Path, list[str]]], wanted: list[str],
                kver: str, modules_root: Path) -> list[tuple[str, Path]]:
    """``wanted`` plus their dependencies, each after what it needs; builtins skipped."""
    order: list[tuple[str, Path]] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        if name not in graph:
            if _is_builtin(kver, modules_root, name):
                return
            raise Internal(f"kernel {kver} has no module {name}")
        path, deps = graph[name]
        for d in deps:
            visit(d)
        order.append((name, path))

    for name in wanted:
        visit(name)
    return order


def _is_builtin(kver: str, modules_root: Path, name: str) -> bool:
    text = (modules_root / kver / "modules.builtin").read_text()
    return any(Path(line).name.split(".ko")[0].replace("-", "_") == name
               for line in text.splitlines())


def extract_vmlinux(bzimage: bytes) -> bytes | None:
    """The uncompressed ELF kernel inside a bzImage (xz or gzip payload), or None.

    Under TCG, decompressing the kernel is a large share of a boot (xz: about 2.5 s of 5
    here); QEMU boots the ELF directly through its PVH entry point instead."""
    import lzma
    import zlib
    for magic, make in ((b"\xfd7zXZ\x00", lzma.LZMADecompressor),
                        (b"\x1f\x8b\x08\x00", lambda: zlib.decompressobj(16 + zlib.MAX_WBITS))):
        i = bzimage.find(magic)
        if i < 0:
            continue
        try:
            out = make().decompress(bzimage[i:])
        except (lzma.LZMAError, zlib.error):
            continue
        if out[:4] == b"\x7fELF":
            return out
    return None


def _inputs_key(kver: str, kernel: Path, mods: list[Path]) -> str:
    h = hashlib.sha256(BUILD_VERSION.encode())
    for p in [kernel, BUSYBOX, *mods]:
        s = p.stat()
        h.update(f"{p}:{s.st_size}:{s.st_mtime_ns}".encode())
    h.update(AGENT_SOURCE.read_bytes())
    h.update(OPAQUE_SOURCE.read_bytes())
    h.update(INIT_SCRIPT.encode())
    h.update(confinement_program())
    return f"{kver}-{h.hexdigest()[:12]}"


class _Cpio:
    """A minimal writer of the ``newc`` cpio format the kernel unpacks."""

    def __init__(self) -> None:
        self.buf = io.BytesIO()
        self.ino = 1

    def _entry(self, name: str, mode: int, data: bytes = b"") -> None:
        fields = [self.ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name) + 1, 0]
        self.ino += 1
        hdr = b"070701" + b"".join(b"%08X" % f for f in fields)
        self.buf.write(hdr + name.encode() + b"\0")
        self.buf.write(b"\0" * (-self.buf.tell() % 4))
        self.buf.write(data)
        self.buf.write(b"\0" * (-self.buf.tell() % 4))

    def dir(self, name: str) -> None:
        self._entry(name, stat.S_IFDIR | 0o755)

    def file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        self._entry(name, stat.S_IFREG | mode, data)

    def symlink(self, name: str, target: str) -> None:
        self._entry(name, stat.S_IFLNK | 0o777, target.encode())

    def finish(self) -> bytes:
        self._entry("TRAILER!!!", 0)
        return self.buf.getvalue()


def _compile_static(src: Path, out: Path) -> Path:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise Internal("building the guest helpers needs gcc (apt-get install gcc libc6-dev)")
    proc = subprocess.run([cc, "-static", "-O2", "-o", str(out), str(src)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise Internal(f"compiling {src.name} failed: {proc.stderr[-2000:]}")
    return out


@functools.lru_cache(maxsize=1)
def confinement_program() -> bytes:
    """The seccomp program (raw BPF) the guest's agent confines every command with: the
    same allowlist and capability set as a container's, since no runc runs in a guest."""
    from dsec.node.host.oci import CAPABILITIES
    from dsec.node.host.seccomp import compile_bpf, sandbox_filter
    return compile_bpf(sandbox_filter(CAPABILITIES))


def _initramfs(agent: Path, opaque: Path, modules: list[tuple[str, Path]]) -> bytes:
    c = _Cpio()
    for d in ["bin", "dev", "etc", "lib", "lib/modules", "proc", "sys", "tmp", "newroot"]:
        c.dir(d)
    c.file("bin/busybox", BUSYBOX.read_bytes(), 0o755)
    for applet in ["sh", "mount", "insmod", "cat", "mkdir", "sleep", "poweroff", "cp", "ip",
                   "hostname", "switch_root", "mke2fs", "echo", "sync"]:
        c.symlink(f"bin/{applet}", "busybox")
    c.file("bin/dsec-agent", agent.read_bytes(), 0o755)
    c.file("bin/dsec-opaque", opaque.read_bytes(), 0o755)
    c.file("etc/dsec-seccomp.bpf", confinement_program(), 0o644)
    for name, path in modules:
        c.file(f"lib/modules/{name}.ko", path.read_bytes())
    c.file("etc/dsec-modules", "".join(f"{n}\n" for n, _ in modules).encode())
    c.file("init", INIT_SCRIPT.encode(), 0o755)
    return c.finish()


def ensure_guest(out: Path, agent: Path | None = None,
                 modules_root: Path = Path("/lib/modules"),
                 boot_dir: Path = Path("/boot")) -> GuestArtifacts:
    """Build (or find) the guest kernel and initramfs under ``out``; idempotent.

    ``agent``: a built dsec-agent to include; by default it is compiled under ``out``."""
    if not BUSYBOX.exists():
        raise Internal("the microvm initramfs needs busybox: apt-get install busybox-static")
    kver = _kernel_version(modules_root)
    kernel_src = boot_dir / f"vmlinuz-{kver}"
    if not kernel_src.exists():
        raise Internal(f"guest kernel {kernel_src} missing: apt-get install linux-image-amd64")
    modules = _load_order(_module_graph(kver, modules_root), MODULES, kver, modules_root)
    key = _inputs_key(kver, kernel_src, [p for _, p in modules])
    dest = Path(out) / key
    elf = dest / "vmlinux"
    art = GuestArtifacts(kernel=elf if elf.exists() else dest / "vmlinuz",
                         bzimage=dest / "vmlinuz", initrd=dest / "initramfs.cpio",
                         kernel_version=kver)
    if art.initrd.exists():
        return art
    tmp = Path(out) / f".{key}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        agent = agent or ensure_agent(Path(out) / "agent")
        shutil.copyfile(kernel_src, tmp / "vmlinuz")
        vmlinux = extract_vmlinux(kernel_src.read_bytes())
        if vmlinux is not None:
            (tmp / "vmlinux").write_bytes(vmlinux)
        opaque = _compile_static(OPAQUE_SOURCE, tmp / "dsec-opaque")
        (tmp / "initramfs.cpio").write_bytes(_initramfs(agent, opaque, modules))
        try:
            os.rename(tmp, dest)
        except OSError:  # another process built the same key first
            if not art.initrd.exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return art.model_copy(update={"kernel": elf if elf.exists() else art.bzimage})


def main(argv: list[str] | None = None) -> int:
    """Command line: build the artefacts and print their paths."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("build/guest"),
                    help="cache directory (default build/guest)")
    args = ap.parse_args(argv)
    art = ensure_guest(args.out)
    print(f"kernel {art.kernel}\ninitrd {art.initrd}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
