"""Create time against the size of the host's mount table (issue 12, 10,000 idle sandboxes).

A container sandbox adds two mounts to the host's table (its ``rw/`` tmpfs, the disk
limit, and its ``rootfs/`` overlay), and runc 1.1 reads ``/proc/self/mountinfo`` several
times per create, so each create costs O(sandboxes) and a fill O(n²). This isolates that
cost: the same busybox create + stop, timed with 0, then 2,000 and 4,000 extra mounts in
the host's table (empty 1 MiB tmpfs mounts standing in for 1,000 or 2,000 sandboxes at
two mounts each, or 2,000 at one mount each), nothing else running. 2,000 vs 4,000 is
what one mount per sandbox instead of two would save at 2,000 sandboxes.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import common

from dsec.api.models import SandboxSpec
from dsec.node.config import NodeConfig
from dsec.node.host import mounts
from dsec.node.service import NodeService

EXTRA = (0, 2000, 4000)


async def creates(node, n: int) -> list[float]:
    """Wall time of ``n`` sequential creates (each stopped before the next)."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        sb = await node.create(SandboxSpec(memory_mb=32, cpu=0.1))
        out.append((time.perf_counter() - t0) * 1000)
        await node.stop(sb.id)
    return out


def fill(root: Path, n: int, have: int) -> None:
    for i in range(have, n):
        d = root / str(i)
        d.mkdir()
        mounts.mount("tmpfs", d, "tmpfs", mounts.MS_NOSUID | mounts.MS_NODEV, "size=1m")


async def run(n: int) -> dict[int, list[float]]:
    got: dict[int, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="dsec-bench-") as tmp:
        tmp = Path(tmp)
        filler = tmp / "extra"
        filler.mkdir()
        node = await NodeService.open(NodeConfig(state_dir=tmp / "state",
                                                 backends=["container"]))
        try:
            await creates(node, 3)  # warm: image mounted, caches hot
            have = 0
            for extra in EXTRA:
                await asyncio.to_thread(fill, filler, extra, have)
                have = extra
                got[extra] = await creates(node, n)
        finally:
            await node.close(stop_sandboxes=True)
            for target in mounts.mounts_under(filler):
                mounts.umount(target)
    return got


def main() -> None:
    args = common.parse_args(__doc__)
    n = 5 if args.quick else 20
    load_before = common.load()
    got = asyncio.run(run(n))
    base = statistics.median(got[0])
    rows = [[f"{extra:,} extra mounts" + (" (baseline)" if extra == 0 else ""),
             str(len(got[extra])), f"{statistics.median(got[extra]):.1f}",
             f"{common.percentile(got[extra], 90):.1f}",
             f"{statistics.median(got[extra]) / base:.2f}x"] for extra in EXTRA]
    per = (statistics.median(got[4000]) - base) / 4000
    body = common.table(["host mount table", "n", "create p50 ms", "create p90 ms",
                         "p50 vs none"], rows)
    notes = [f"Each extra mount adds {per * 1000:.1f} µs to a create (p50, 4,000 vs none); "
             f"a fill of N sandboxes at 2 mounts each costs about {per:.4f} x N² ms more "
             "than at none.",
             "Create: in-process node, busybox, memory_mb=32, cpu=0.1, stopped before the "
             "next; extra mounts: empty 1 MiB tmpfs mounts under one directory.",
             f"Load average before the run: {load_before}."]
    common.publish("density_mounts-quick" if args.quick else "density_mounts",
                   "Create time against the host's mount table (issue 12)", body, notes)


if __name__ == "__main__":
    main()
