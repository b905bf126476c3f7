"""100 sandboxes from 10 images sharing one base, on a cold node with a remote store.

Measures the bytes the node fetches with on-demand loading (256 KiB verified chunks through
the lazy FUSE file) beside the full-pull baseline (each layer downloaded whole and verified
before its first mount), and the time to create all sandboxes.

Workload (synthetic, documented so the figure can be judged): the registry holds busybox,
a 48 MiB "OS" base layer (/usr/lib: 20 folders x 100 files of ~24 KiB, incompressible)
and ten 7 MiB workspace layers (/work: 10 folders x 30 files); image i = busybox + base +
workspace i. Sandbox s uses image s % 10 and, like an agent starting a shell and a test
run, reads busybox whole and 2 of the 20 base folders (its "interpreter and stdlib"); in
its workspace it reads, with ``--workload same`` (default: replicas of one task touch the
same code), folders 0-2 plus one file picked by its replica number, and with
``--workload spread`` (pessimistic: replicas touch disjoint code) folder s // 10, so the
ten replicas of an image read all of its workspace between them. Each sandbox is an overlay with its own upper dir over the resolved layers.
The store is on loopback, so times show the node's own costs, not a network's.

    .venv/bin/python benchmarks/bench_images_lazy.py [--quick]
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from bench_images_common import make_tree, median, mib, overlay, read_all, serve, table  # noqa: E402

from dsec.images import ImageService, RemoteConfig  # noqa: E402

IMAGES = 10


def build_registry(root: pathlib.Path) -> tuple[ImageService, list[str]]:
    reg = ImageService(root / "registry")
    bb = reg.manifest(reg.ensure_busybox()).layers
    make_tree(root / "base/usr/lib", 20, 100, 24 << 10, seed=1)
    base = reg.add_layer_dir(root / "base")
    names = []
    for i in range(IMAGES):
        make_tree(root / f"ws{i}/work", 10, 30, 24 << 10, seed=100 + i)
        ws = reg.add_layer_dir(root / f"ws{i}")
        names.append(f"bench/img{i}:v1")
        reg.commit(names[-1], [*bb, base, ws])
    return reg, names


def run_node(root: pathlib.Path, url: str, lazy: bool, names: list[str], sandboxes: int,
             workload: str):
    node = ImageService(root, remote=RemoteConfig(url=url, lazy=lazy))
    latencies = []
    t_all = time.perf_counter()
    try:
        for s in range(sandboxes):
            t0 = time.perf_counter()
            r = node.resolve(names[s % IMAGES])
            with overlay(r.lowerdirs, root / "sb" / str(s)) as m:
                files = [m / "bin/busybox"]
                files += sorted((m / "usr/lib/d000").iterdir())
                files += sorted((m / "usr/lib/d001").iterdir())
                replica = s // IMAGES
                if workload == "spread":
                    files += sorted((m / f"work/d{replica % 10:03d}").iterdir())
                else:
                    for d in range(3):
                        files += sorted((m / f"work/d{d:03d}").iterdir())
                    files.append(m / f"work/d{3 + replica % 7:03d}/f{replica % 30:04d}")
                read_all(files)
            latencies.append(time.perf_counter() - t0)
        return node.bytes_fetched, latencies, time.perf_counter() - t_all
    finally:
        node.unmount_all()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="20 sandboxes, 1 repetition")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--workload", choices=["same", "spread"], default="same")
    args = ap.parse_args()
    sandboxes, reps = (20, 1) if args.quick else (100, args.reps)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench-images-lazy-"))
    try:
        reg, names = build_registry(tmp)
        manifests = [reg.manifest(n) for n in names]
        images_total = sum(lr.size for m in manifests for lr in m.layers)
        unique = sum({lr.digest: lr.size for m in manifests for lr in m.layers}.values())
        results = {}
        with serve(reg) as url:
            for lazy in (True, False):
                runs = [run_node(tmp / f"node-{lazy}-{k}", url, lazy, names, sandboxes,
                                 args.workload)
                        for k in range(reps)]
                results[lazy] = (median(r[0] for r in runs),
                                 median(x for r in runs for x in r[1]),
                                 median(r[2] for r in runs))
        reg.unmount_all()
        rows = []
        for label, lazy in (("on demand (chunks)", True), ("full pull (baseline)", False)):
            fetched, lat, total = results[lazy]
            rows.append([label, mib(fetched), f"{100 * fetched / images_total:5.1f} %",
                         f"{100 * fetched / unique:5.1f} %", f"{lat * 1000:7.1f} ms",
                         f"{total:6.2f} s"])
        table(f"{sandboxes} sandboxes, {IMAGES} images sharing a base; images total "
              f"{mib(images_total).strip()}, distinct layers {mib(unique).strip()} "
              f"(workload {args.workload!r}, median of {reps})",
              ["mode", "fetched", "of images' total", "of distinct layers",
               "median create+read", "all sandboxes"], rows)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
