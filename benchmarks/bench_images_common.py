"""Shared helpers of the image benchmarks: a loopback layer store, synthetic trees, tables."""

from __future__ import annotations

import contextlib
import os
import pathlib
import random
import socket
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator

from dsec.images import ImageService

WORDS = ("def class return import self value result items config path node layer "
         "sandbox image chunk cache mount overlay erofs test assert yield async await").split()


def text_blob(rng: random.Random, size: int) -> bytes:
    """Source-code-like, compressible bytes."""
    out, n = [], 0
    while n < size:
        line = "    " * rng.randint(0, 3) + " ".join(rng.choices(WORDS, k=rng.randint(3, 10))) + "\n"
        out.append(line)
        n += len(line)
    return "".join(out).encode()[:size]


def make_tree(root: pathlib.Path, dirs: int, files_per_dir: int, size: int, seed: int,
              compressible: bool = False) -> None:
    """``dirs`` x ``files_per_dir`` files of about ``size`` bytes under ``root``."""
    rng = random.Random(seed)
    for d in range(dirs):
        sub = root / f"d{d:03d}"
        sub.mkdir(parents=True, exist_ok=True)
        for f in range(files_per_dir):
            n = max(1, int(size * rng.uniform(0.5, 1.5)))
            data = text_blob(rng, n) if compressible else rng.randbytes(n)
            (sub / f"f{f:04d}").write_bytes(data)


@contextlib.contextmanager
def serve(svc: ImageService) -> Iterator[str]:
    """Serve ``svc``'s blobs over HTTP on loopback; yields the base URL."""
    import uvicorn
    from fastapi import FastAPI

    from dsec.images.http import blob_router

    app = FastAPI()
    app.include_router(blob_router(svc))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@contextlib.contextmanager
def overlay(lowerdirs, base: pathlib.Path) -> Iterator[pathlib.Path]:
    """A writable overlay over ``lowerdirs`` (a sandbox's root filesystem, minus runc)."""
    merged, upper, work = base / "merged", base / "upper", base / "work"
    for d in (merged, upper, work):
        d.mkdir(parents=True, exist_ok=True)
    opts = f"lowerdir={':'.join(map(str, lowerdirs))},upperdir={upper},workdir={work}"
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, str(merged)], check=True)
    try:
        yield merged
    finally:
        subprocess.run(["umount", str(merged)], check=True)


def read_all(paths) -> int:
    """Read every file fully; returns bytes read."""
    n = 0
    for p in paths:
        with open(p, "rb") as f:
            while chunk := f.read(1 << 20):
                n += len(chunk)
    return n


def drop_caches() -> None:
    """Empty the page cache (root only) so memory and cold reads start from zero."""
    os.sync()
    pathlib.Path("/proc/sys/vm/drop_caches").write_text("3\n")


def meminfo(key: str = "Cached") -> int:
    """A /proc/meminfo figure in bytes."""
    for line in open("/proc/meminfo"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def median(xs) -> float:
    return statistics.median(xs)


def mib(n: float) -> str:
    return f"{n / (1 << 20):8.2f} MiB"


def table(title: str, header: list[str], rows: list[list[str]]) -> None:
    """Print an aligned table."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    print(f"\n{title}")
    for r in [header, ["-" * w for w in widths], *rows]:
        print("  ".join(str(c).rjust(w) for c, w in zip(r, widths)))
