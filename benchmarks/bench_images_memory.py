"""Host memory added per extra sandbox of the same image, shared layers versus private copies.

Each sandbox reads the same 14 MiB working set (a quarter of a 48 MiB base layer, plus
busybox). With dsec layers every sandbox's overlay sits on the one read-only EROFS mount of
each layer, so the page cache holds one copy; the baseline gives every sandbox its own
unpacked copy of the image (what a per-sandbox rootfs extraction does), so each one pays
for its own pages. Memory is the growth of the kernel's page cache ("Cached" in
/proc/meminfo) after the page cache is dropped; other activity on the machine adds noise,
hence the medians.

    .venv/bin/python benchmarks/bench_images_memory.py [--quick]
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from bench_images_common import (drop_caches, make_tree, median, meminfo, mib,  # noqa: E402
                                 overlay, read_all, table)

from dsec.images import ImageService  # noqa: E402


def working_set(root: pathlib.Path) -> list[pathlib.Path]:
    files = [root / "bin/busybox"]
    for d in range(5):
        files += sorted((root / f"usr/lib/d{d:03d}").iterdir())
    return files


def measure(sandboxes: list[pathlib.Path]) -> list[int]:
    """Page cache growth after each sandbox reads its working set."""
    drop_caches()
    before = meminfo()
    growth = []
    for root in sandboxes:
        read_all(working_set(root))
        now = meminfo()
        growth.append(now - before)
        before = now
    return growth


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="4 sandboxes, 1 repetition")
    args = ap.parse_args()
    n, reps = (4, 1) if args.quick else (8, 3)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench-images-mem-"))
    svc = ImageService(tmp / "state")
    try:
        bb = svc.manifest(svc.ensure_busybox()).layers
        make_tree(tmp / "base/usr/lib", 20, 100, 24 << 10, seed=1)
        svc.commit("bench/mem:v1", [*bb, svc.add_layer_dir(tmp / "base")])
        r = svc.resolve("bench/mem:v1")
        shared_first, shared_extra, copy_first, copy_extra = [], [], [], []
        for k in range(reps):
            stack = [overlay(r.lowerdirs, tmp / f"sb{k}-{i}") for i in range(n)]
            roots = [cm.__enter__() for cm in stack]
            try:
                g = measure(roots)
            finally:
                for cm in stack:
                    cm.__exit__(None, None, None)
            shared_first.append(g[0])
            shared_extra.append(median(g[1:]))
            copies = []
            for i in range(n):
                dest = tmp / f"copy{k}-{i}"
                subprocess.run(["cp", "-a", str(r.lowerdirs[0]), str(dest)], check=True)
                subprocess.run(["cp", "-a", str(r.lowerdirs[1]) + "/.", str(dest)], check=True)
                copies.append(dest)
            g = measure(copies)
            copy_first.append(g[0])
            copy_extra.append(median(g[1:]))
            for c in copies:
                shutil.rmtree(c)
        table(f"page cache added by sandboxes reading the same 14 MiB working set "
              f"({n} sandboxes, median of {reps})",
              ["rootfs", "first sandbox", "each extra sandbox"],
              [["shared EROFS layers", mib(median(shared_first)), mib(median(shared_extra))],
               ["private copy (baseline)", mib(median(copy_first)), mib(median(copy_extra))]])
    finally:
        svc.unmount_all()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
