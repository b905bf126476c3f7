"""On-demand layer loading: a tiny read-only FUSE filesystem of remote blobs.

Mechanism. Each remote layer appears as a regular file ``<mount>/<hex>`` whose bytes are
fetched from the remote store in 256 KiB chunks the first time the kernel reads them (then
served from the node-local chunk cache). The layer's EROFS image is mounted file-backed
*on that file*, exactly as a local blob would be, so EROFS, overlayfs and the page cache
behave the same whether a layer is local or remote; only the bytes the sandboxes touch
cross the network.

Why this and not another: EROFS over fscache/cachefiles ("on-demand mode") needs a
userspace daemon speaking the cachefiles protocol and a kernel built with it; NBD or ublk
need a block device per layer (the loop-device-like churn we avoid). A FUSE *file* needs
only ``/dev/fuse``. No library: ``fusepy`` wants libfuse2 and ``pyfuse3`` wants libfuse3
headers and trio, while the part of the FUSE protocol a read-only, flat directory of
immutable files needs (INIT, LOOKUP, GETATTR, OPEN, READ, RELEASE, STATFS) is a few dozen
lines of ``struct``; it runs in a detached daemon process (``python -m
dsec.images.lazyfs``) so mounts outlive the process that resolved them.

The daemon learns a layer from ``<cache>/<hex>/meta.json`` (its LayerRef, written by the
node from a verified manifest) and checks the chunk table and every chunk against it.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import os
import stat
import struct
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from dsec.images.models import LayerRef
from dsec.images.remote import ChunkCache, RemoteStore, open_remote

__all__ = ["LazyFS", "main"]

# Opcodes and flags from <linux/fuse.h>.
LOOKUP, FORGET, GETATTR, OPEN, READ, STATFS, RELEASE = 1, 2, 3, 14, 15, 17, 18
GETXATTR, LISTXATTR, FLUSH, INIT, OPENDIR, READDIR, RELEASEDIR = 22, 23, 25, 26, 27, 28, 29
ACCESS, INTERRUPT, DESTROY, BATCH_FORGET = 34, 36, 38, 42
NO_REPLY = {FORGET, BATCH_FORGET, INTERRUPT}
FUSE_ASYNC_READ, FUSE_MAX_PAGES = 1 << 0, 1 << 22
FOPEN_KEEP_CACHE = 1 << 1
IN_HEADER = struct.Struct("<IIQQIIIHH")
OUT_HEADER = struct.Struct("<IiQ")
ATTR = struct.Struct("<QQQQQQIIIIIIIIII")
READ_IN = struct.Struct("<QQIIQII")
ROOT, TTL = 1, 3600
MS_NOSUID, MS_NODEV, MS_RDONLY = 2, 4, 1


class LazyFS:
    """A flat, read-only FUSE directory whose files are remote blobs, fetched on demand."""

    def __init__(self, mountpoint: str, remote: RemoteStore, workers: int = 8) -> None:
        self.mountpoint, self.remote = mountpoint, remote
        self.fd = -1
        self.nodes: dict[int, tuple[str, int, bytes]] = {}  # nodeid -> (digest, size, table)
        self.by_hex: dict[str, int] = {}
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="lazyfs-read")
        self.t0 = int(time.time())

    def mount(self) -> None:
        """Open /dev/fuse and mount it at the mount point."""
        self.fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
        opts = f"fd={self.fd},rootmode=40000,user_id=0,group_id=0,allow_other".encode()
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.mount(b"dsec-lazy", os.fsencode(self.mountpoint), b"fuse",
                      ctypes.c_ulong(MS_NOSUID | MS_NODEV | MS_RDONLY), opts) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mount fuse at {self.mountpoint}: {os.strerror(err)}")

    def serve(self) -> None:
        """Answer kernel requests until the filesystem is unmounted."""
        while True:
            try:
                buf = os.read(self.fd, (1 << 20) + 4096)
            except OSError as exc:
                if exc.errno in (errno.EINTR, errno.EAGAIN, errno.ENOENT):
                    continue
                if exc.errno == errno.ENODEV:  # unmounted
                    break
                raise
            length, opcode, unique, nodeid = IN_HEADER.unpack_from(buf)[:4]
            body = buf[IN_HEADER.size:length]
            if opcode == READ:
                self.pool.submit(self._reply_safe, unique, self._read, nodeid, body)
            elif opcode == DESTROY:
                self._reply(unique, 0, b"")
                break
            elif opcode not in NO_REPLY:
                self._reply_safe(unique, self._dispatch, opcode, nodeid, body)
        self.pool.shutdown(wait=True)

    # -- replies -----------------------------------------------------------------------
    def _reply(self, unique: int, error: int, data: bytes) -> None:
        try:
            os.write(self.fd, OUT_HEADER.pack(OUT_HEADER.size + len(data), -error, unique) + data)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENODEV):  # request interrupted / gone
                raise

    def _reply_safe(self, unique: int, fn, *args) -> None:
        try:
            data = fn(*args)
            self._reply(unique, 0, data)
        except OSError as exc:
            self._reply(unique, exc.errno or errno.EIO, b"")
        except Exception as exc:  # corrupt chunk, network failure: the reader gets EIO
            print(f"lazyfs: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            self._reply(unique, errno.EIO, b"")

    # -- operations --------------------------------------------------------------------
    def _dispatch(self, opcode: int, nodeid: int, body: bytes) -> bytes:
        if opcode == INIT:
            return self._init(body)
        if opcode == LOOKUP:
            return self._lookup(nodeid, body.split(b"\0", 1)[0].decode())
        if opcode == GETATTR:
            return struct.pack("<QII", TTL, 0, 0) + self._attr(nodeid)
        if opcode == OPEN:
            return struct.pack("<QIi", 0, FOPEN_KEEP_CACHE, 0)
        if opcode in (OPENDIR, RELEASE, RELEASEDIR, FLUSH, ACCESS):
            return struct.pack("<QIi", 0, 0, 0) if opcode == OPENDIR else b""
        if opcode == READDIR:
            return b""
        if opcode == STATFS:
            return struct.pack("<QQQQQIIII", 0, 0, 0, 0, 0, 4096, 255, 4096, 0) + bytes(24)
        raise OSError(errno.ENOSYS, "not implemented")

    def _init(self, body: bytes) -> bytes:
        major, minor, max_readahead, kflags = struct.unpack_from("<IIII", body)
        flags = kflags & (FUSE_ASYNC_READ | FUSE_MAX_PAGES)
        # major, minor, max_readahead, flags, max_background, congestion_threshold,
        # max_write, time_gran, max_pages, map_alignment, flags2, max_stack_depth, unused[6]
        return struct.pack("<IIIIHHIIHHII24x", 7, 31, max_readahead, flags, 16, 12,
                           128 << 10, 1, 64, 0, 0, 0)

    def _attr(self, nodeid: int) -> bytes:
        if nodeid == ROOT:
            return ATTR.pack(ROOT, 0, 0, self.t0, self.t0, self.t0, 0, 0, 0,
                             stat.S_IFDIR | 0o555, 2, 0, 0, 0, 4096, 0)
        with self.lock:
            node = self.nodes.get(nodeid)
        if node is None:
            raise OSError(errno.ENOENT, "unknown node")
        size = node[1]
        return ATTR.pack(nodeid, size, (size + 511) // 512, self.t0, self.t0, self.t0, 0, 0, 0,
                         stat.S_IFREG | 0o444, 1, 0, 0, 0, 4096, 0)

    def _lookup(self, parent: int, name: str) -> bytes:
        if parent != ROOT or len(name) != 64 or not all(c in "0123456789abcdef" for c in name):
            raise OSError(errno.ENOENT, name)
        with self.lock:
            nodeid = self.by_hex.get(name)
        if nodeid is None:
            meta = self.remote.cache.root / name / "meta.json"
            try:
                ref = LayerRef.model_validate_json(meta.read_bytes())
            except FileNotFoundError:
                raise OSError(errno.ENOENT, name) from None
            table = self.remote.chunk_table(ref.digest, ref.chunks or "")
            with self.lock:
                nodeid = self.by_hex.setdefault(name, len(self.nodes) + 2)
                self.nodes[nodeid] = (ref.digest, ref.size, table)
        return struct.pack("<QQQQII", nodeid, 0, TTL, TTL, 0, 0) + self._attr(nodeid)

    def _read(self, nodeid: int, body: bytes) -> bytes:
        _, offset, size = READ_IN.unpack_from(body)[:3]
        with self.lock:
            digest, total, table = self.nodes[nodeid]
        return self.remote.read(digest, offset, size, table, total)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the daemon: mount, then serve until unmounted."""
    ap = argparse.ArgumentParser(prog="python -m dsec.images.lazyfs")
    ap.add_argument("--mount", required=True, help="Mount point of the blob directory.")
    ap.add_argument("--cache", required=True, help="Chunk cache directory.")
    ap.add_argument("--url", required=True, help="Base URL of the remote layer store.")
    ap.add_argument("--cache-max-bytes", type=int, default=None,
                    help="Bound of the chunk cache (LRU eviction past it).")
    args = ap.parse_args(argv)
    remote = open_remote(args.url, ChunkCache(args.cache, args.cache_max_bytes),
                         token=os.environ.get("DSEC_TOKEN"))
    fs = LazyFS(args.mount, remote)
    fs.mount()
    try:
        fs.serve()
    finally:
        remote.close()


if __name__ == "__main__":
    main()
