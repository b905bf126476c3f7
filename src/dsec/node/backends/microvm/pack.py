"""Packing a guest's writable layer into an image layer (``pack_diff`` for microvm).

The host never mounts a filesystem the guest wrote: a crafted ext4 would be parsed by the
host kernel. Instead the guest streams a plain tar of its overlay upper dir through the
agent, plus the list of opaque directories (``/.dsec/opaque``; tar cannot carry xattrs),
and the host rewrites it into an OCI-style layer tar: an overlay whiteout (char device 0/0)
becomes ``.wh.NAME``, an opaque directory gets ``.wh..wh..opq``. The image service's
untrusted-tar import then builds the EROFS layer, refusing hostile entries by name.
"""

from __future__ import annotations

import shutil
import socket
import tarfile
from collections.abc import Callable
from pathlib import PurePosixPath

from dsec.api.errors import InvalidArgument
from dsec.images.importer import layer_from_tar
from dsec.images.models import LayerInfo
from dsec.images.refs import layer_id, normalize_ref
from dsec.images.stage import excluded
from dsec.images.tarsafe import TarLimits
from dsec.node.backends.microvm.agentsync import SyncCommand

__all__ = ["pack_guest_upper", "UPPER"]

UPPER = "/.dsec/rw/upper"
BB = "/.dsec/busybox"


class _StreamReader:
    """stdout of a guest command as a file object ``tarfile`` can stream from."""

    def __init__(self, cmd: SyncCommand) -> None:
        self.cmd, self.buf, self.err, self.done = cmd, b"", bytearray(), False
        cmd.close_stdin()

    def read(self, n: int = -1) -> bytes:
        while not self.done and (n < 0 or len(self.buf) < n):
            kind, data = self.cmd.next_event()
            if kind == "stdout":
                self.buf += data
            elif kind == "stderr":
                self.err += data
            else:
                self.done = True
        if n < 0:
            n = len(self.buf)
        out, self.buf = self.buf[:n], self.buf[n:]
        return out


def _guest_run(connect: Callable[[], socket.socket], script: str) -> bytes:
    # the node's own reads (overlay's trusted.* xattrs need CAP_SYS_ADMIN): not confined
    code, out, err = SyncCommand(connect, [BB, "sh", "-c", script], unconfined=True).run()
    if code:
        raise InvalidArgument(f"reading the guest's writable layer failed: "
                              f"{err.decode(errors='replace')[-500:]}")
    return out


def _rewrite(src: tarfile.TarFile, dst: tarfile.TarFile, opaque: set[str],
             exclude: list[str], limits: TarLimits) -> None:
    """Copy ``src`` (a raw upper dir) into ``dst`` as an OCI layer; see the module doc."""
    total = 0
    for m in src:
        name = str(PurePosixPath(m.name))  # "./etc/x" -> "etc/x", "./" -> "."
        rel = "/" if name == "." else "/" + name.lstrip("/")
        if rel == "/" or excluded(rel, exclude):
            continue
        total += m.size
        if total > limits.max_bytes:
            raise InvalidArgument(f"the sandbox's writable layer is larger than "
                                  f"{limits.max_bytes} bytes")
        if m.ischr() and m.devmajor == 0 and m.devminor == 0:
            p = PurePosixPath(m.name)
            wh = tarfile.TarInfo(str(p.parent / f".wh.{p.name}"))
            dst.addfile(wh)
            continue
        dst.addfile(m, src.extractfile(m) if m.isreg() else None)
        if m.isdir() and rel[1:] in opaque:
            dst.addfile(tarfile.TarInfo(str(PurePosixPath(m.name) / ".wh..wh..opq")))


def pack_guest_upper(images, connect: Callable[[], socket.socket], tag: str, base,
                     exclude: list[str] | None = None,
                     limits: TarLimits | None = None) -> LayerInfo:
    """Pack the guest's upper dir as a layer over ``base`` (a ResolvedImage), tag both
    (a project's token's snapshot is that project's: ``images.claim``)."""
    tag = normalize_ref(tag)
    project = images.claim(tag)  # before the work: a tag it may not write fails at once
    limits = limits or TarLimits()
    exclude = ["/.dsec", *(exclude or [])]
    _guest_run(connect, "sync")
    listing = _guest_run(connect, f"/.dsec/opaque {UPPER}").decode(errors="surrogateescape")
    opaque = {"" if p == "." else p for p in listing.splitlines()}
    cmd = SyncCommand(connect, [BB, "tar", "-C", UPPER, "-cf", "-", "."], unconfined=True)
    reader = _StreamReader(cmd)
    work = images.store.tempdir("guestpack-")
    try:
        with open(work / "layer.tar", "w+b") as out:
            try:
                with tarfile.open(fileobj=reader, mode="r|") as src, \
                        tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as dst:
                    _rewrite(src, dst, opaque, exclude, limits)
                reader.read()  # to the exit frame
            finally:
                cmd.close()
            if cmd.exit_code:
                raise InvalidArgument(f"tar of the guest's writable layer failed: "
                                      f"{bytes(reader.err).decode(errors='replace')[-500:]}")
            out.seek(0)
            layer = layer_from_tar(images, out, limits, name="sandbox upper dir")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    layers = [images.layer_ref(d) for d in base.layer_digests] + [layer]
    digest = images.commit(tag, layers, base.config, project=project)
    return LayerInfo(digest=layer.digest, size=layer.size, id=layer_id(layer.digest),
                     manifest_digest=digest, tag=tag)
