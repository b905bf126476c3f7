"""Layer build time and size for a workspace of a few thousand files: EROFS versus tar.gz.

The workspace is 3,000 source-like text files (~8 KiB each, 24 MiB) in 60 folders. dsec
builds uncompressed EROFS layers (reads map straight onto blob pages and 256 KiB chunks);
lz4hc-compressed EROFS is shown too. The baseline is ``tar czf`` (what an OCI layer is).

    .venv/bin/python benchmarks/bench_images_build.py [--quick]
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from bench_images_common import make_tree, median, mib, table  # noqa: E402

from dsec.images import ImageService  # noqa: E402


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 repetitions")
    args = ap.parse_args()
    reps = 2 if args.quick else 5
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench-images-build-"))
    try:
        src = tmp / "ws"
        make_tree(src, 60, 50, 8 << 10, seed=3, compressible=True)
        raw = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
        svc = ImageService(tmp / "state")
        out = tmp / "out"
        out.mkdir()
        rows = []
        cases = {
            "dsec layer (EROFS, add to store)": lambda: svc.add_layer_dir(src),
            "mkfs.erofs, uncompressed": lambda: subprocess.run(
                ["mkfs.erofs", "--quiet", str(out / "a.erofs"), str(src)], check=True),
            "mkfs.erofs -zlz4hc": lambda: subprocess.run(
                ["mkfs.erofs", "--quiet", "-zlz4hc", str(out / "b.erofs"), str(src)], check=True),
            "tar czf (baseline)": lambda: subprocess.run(
                ["tar", "czf", str(out / "c.tar.gz"), "-C", str(src), "."], check=True),
        }
        for name, fn in cases.items():
            times = [timed(fn) for _ in range(reps)]
            rows.append([name, f"{median(times) * 1000:7.0f} ms"])
        layer = svc.add_layer_dir(src)
        sizes = [layer.size, (out / "a.erofs").stat().st_size, (out / "b.erofs").stat().st_size,
                 (out / "c.tar.gz").stat().st_size]
        for row, size in zip(rows, sizes):
            row.append(mib(size))
        table(f"building a layer of 3,000 files ({mib(raw).strip()} of data; median of {reps})",
              ["format", "build time", "size"], rows)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
