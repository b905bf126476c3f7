"""Sandbox create latency on a node: cold chunk cache versus warm, beside local layers.

A create here is what the container backend does before runc starts: resolve the image
(mount any layer not mounted yet), mount the sandbox overlay, and then the first reads a
starting sandbox makes (busybox, 2 of the 20 base folders, 1 workspace folder; about
7 MiB). Every measurement starts with no layer mounted and the page cache dropped; the
node's lazy-loading daemon is already running (its start, once per node, is shown apart),
so only the chunk cache differs:

- cold: a fresh node, empty chunk cache: every chunk read comes over HTTP (loopback).
- warm: the same node again: every chunk comes from the local chunk cache.
- local (baseline): the layers are whole blobs on the node's disk (a full pull done
  earlier); their first mount re-verifies each blob's digest.

    .venv/bin/python benchmarks/bench_images_cache.py [--quick]
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from bench_images_common import (drop_caches, make_tree, median, mib, overlay,  # noqa: E402
                                 read_all, serve, table)

from dsec.images import ImageService, RemoteConfig  # noqa: E402


def create(node: ImageService, image: str, sb: pathlib.Path) -> tuple[float, int]:
    node.mounts.unmount_all()  # layer mounts only: the lazy-loading daemon stays up
    drop_caches()
    t0 = time.perf_counter()
    r = node.resolve(image)
    with overlay(r.lowerdirs, sb) as m:
        files = [m / "bin/busybox", *sorted((m / "usr/lib/d000").iterdir()),
                 *sorted((m / "usr/lib/d001").iterdir()), *sorted((m / "work/d000").iterdir())]
        n = read_all(files)
    return time.perf_counter() - t0, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 repetitions")
    args = ap.parse_args()
    reps = 2 if args.quick else 7
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench-images-cache-"))
    reg = ImageService(tmp / "registry")
    try:
        bb = reg.manifest(reg.ensure_busybox()).layers
        make_tree(tmp / "base/usr/lib", 20, 100, 24 << 10, seed=1)
        make_tree(tmp / "ws/work", 10, 30, 24 << 10, seed=2)
        reg.commit("bench/cache:v1", [*bb, reg.add_layer_dir(tmp / "base"),
                                      reg.add_layer_dir(tmp / "ws")])
        cold, warm, local, fetched, daemon = [], [], [], [], []
        with serve(reg) as url:
            for k in range(reps):
                node = ImageService(tmp / f"node{k}", remote=RemoteConfig(url=url))
                try:
                    t0 = time.perf_counter()
                    node.sources.daemon.ensure()
                    daemon.append(time.perf_counter() - t0)
                    t, read = create(node, "bench/cache:v1", tmp / f"sb{k}a")
                    cold.append(t)
                    fetched.append(node.bytes_fetched)
                    warm.append(create(node, "bench/cache:v1", tmp / f"sb{k}b")[0])
                    assert node.bytes_fetched == fetched[-1], "warm run fetched bytes"
                finally:
                    node.unmount_all()
            pulled = ImageService(tmp / "pulled", remote=RemoteConfig(url=url, lazy=False))
            try:
                pulled.resolve("bench/cache:v1")
                for k in range(reps):
                    local.append(create(pulled, "bench/cache:v1", tmp / f"sb{k}c")[0])
            finally:
                pulled.unmount_all()
        table(f"create + first reads ({mib(read).strip()} read; median of {reps})",
              ["layers", "latency", "fetched per create"],
              [["remote, cold chunk cache", f"{median(cold) * 1000:7.1f} ms", mib(median(fetched))],
               ["remote, warm chunk cache", f"{median(warm) * 1000:7.1f} ms", mib(0)],
               ["local blobs (baseline)", f"{median(local) * 1000:7.1f} ms", mib(0)]])
        print(f"(once per node: starting the lazy-loading daemon took "
              f"{median(daemon) * 1000:.0f} ms)")
    finally:
        reg.unmount_all()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
