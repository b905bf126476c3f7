"""Create time against the size of the host's mount table (issue 12, 10,000 idle sandboxes).

A container sandbox adds two mounts to the host's table (its ``rw/`` tmpfs, the disk
limit, and its ``rootfs/`` overlay), all under ``<state>/sandboxes``, and runc 1.1 reads
``/proc/self/mountinfo`` several times per create: started in the host's namespace, each
create costs O(sandboxes) and a fill O(n²). dsec now starts runc in a mount namespace of
its own with that subtree detached (``dsec-agent bundle``, node/host/runcns.py). This times
the same busybox create + stop with 0, 2,000 and 4,000 extra mounts (a tmpfs and an overlay
over it for each of 1,000 and 2,000 stand-in sandboxes, under the new node's
``<state>/sandboxes``, where real sandboxes' mounts sit), on two nodes side by side: one with
``runc_sees_host=True`` (the old way, the baseline) and one with runc apart; their creates
alternate, so both see the same host table and the same machine load.
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import common

from dsec.api.models import SandboxSpec
from dsec.node.backends.config import ContainerBackendConfig
from dsec.node.config import NodeConfig
from dsec.node.host import mounts
from dsec.node.service import NodeService

EXTRA = (0, 2000, 4000)
MODES = ("host", "apart")  # runc in the host's mount namespace (baseline) / in its own


async def create_stop(node) -> float:
    t0 = time.perf_counter()
    sb = await node.create(SandboxSpec(memory_mb=32, cpu=0.1))
    took = (time.perf_counter() - t0) * 1000
    await node.stop(sb.id)
    return took


def fill(root: Path, lower: Path, n: int, have: int) -> None:
    """Extra mounts up to ``n``, two per stand-in sandbox as a real one has: a 1 MiB tmpfs
    ``rw/`` and an overlay ``rootfs/`` over it (its options, which mountinfo prints, as long
    as a one-layer image's)."""
    for i in range(have // 2, n // 2):
        rw, rootfs = root / str(i) / "rw", root / str(i) / "rootfs"
        rw.mkdir(parents=True)
        rootfs.mkdir()
        mounts.mount("tmpfs", rw, "tmpfs", mounts.MS_NOSUID | mounts.MS_NODEV, "size=1m")
        (rw / "upper").mkdir()
        (rw / "work").mkdir()
        mounts.mount("overlay", rootfs, "overlay", 0,
                     f"lowerdir={lower},upperdir={rw / 'upper'},workdir={rw / 'work'}")


async def run(n: int) -> dict[tuple[str, int], list[float]]:
    got: dict[tuple[str, int], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="dsec-bench-") as tmp:
        tmp = Path(tmp)
        nodes = {mode: await NodeService.open(NodeConfig(
            state_dir=tmp / mode, backends=["container"],
            container=ContainerBackendConfig(runc_sees_host=mode == "host")))
            for mode in MODES}
        filler = tmp / "apart" / "sandboxes" / "extra"  # after open: no orphan sweep
        filler.mkdir()
        lower = tmp / "images" / "mnt" / ("0" * 64)  # a layer mount's path, in length
        lower.mkdir(parents=True)
        try:
            for node in nodes.values():
                for _ in range(3):  # warm: image mounted, caches hot
                    await create_stop(node)
            have = 0
            for extra in EXTRA:
                await asyncio.to_thread(fill, filler, lower, extra, have)
                have = extra
                for i in range(n):
                    order = MODES if i % 2 == 0 else MODES[::-1]
                    for mode in order:
                        got.setdefault((mode, extra), []).append(await create_stop(nodes[mode]))
        finally:
            for target in mounts.mounts_under(filler):
                mounts.umount(target)
            shutil.rmtree(filler, ignore_errors=True)
            for node in nodes.values():
                await node.close(stop_sandboxes=True)
    return got


def main() -> None:
    args = common.parse_args(__doc__)
    n = 5 if args.quick else 20
    load_before = common.load()
    got = asyncio.run(run(n))
    p50 = {k: statistics.median(v) for k, v in got.items()}
    rows = []
    for extra in EXTRA:
        rows.append([f"{extra:,} extra mounts",
                     f"{p50['host', extra]:.1f}",
                     f"{common.percentile(got['host', extra], 90):.1f}",
                     f"{p50['host', extra] / p50['host', 0]:.2f}x",
                     f"{p50['apart', extra]:.1f}",
                     f"{common.percentile(got['apart', extra], 90):.1f}",
                     f"{p50['apart', extra] / p50['apart', 0]:.2f}x",
                     f"{p50['apart', extra] / p50['host', extra]:.2f}x"])
    body = common.table(["host mount table", "runc sees host (baseline): p50 ms", "p90 ms",
                         "p50 vs none", "runc apart: p50 ms", "p90 ms", "p50 vs none",
                         "apart / baseline p50"], rows)
    per = {m: (p50[m, EXTRA[-1]] - p50[m, 0]) / EXTRA[-1] * 1000 for m in MODES}
    notes = [f"n = {n} creates per cell, the two nodes' creates alternating (which goes first "
             "swaps every round).",
             f"Each extra mount adds {per['host']:.1f} µs to a create when runc sees the host's "
             f"table and {per['apart']:.1f} µs when it runs apart (p50, {EXTRA[-1]:,} vs none).",
             "Create: in-process nodes, busybox, memory_mb=32, cpu=0.1, stopped before the "
             "next; extra mounts: per stand-in sandbox a 1 MiB tmpfs and an overlay over it "
             "(one lower dir), under the runc-apart node's <state>/sandboxes/extra/ (inside "
             "its self-bind, as real sandboxes' are); the "
             "baseline's runc reads the whole host table, so for it where they sit does not "
             "matter.",
             f"Load average before the run: {load_before}."]
    common.publish("density_mounts-quick" if args.quick else "density_mounts",
                   "Create time against the host's mount table (issue 12)", body, notes)


if __name__ == "__main__":
    main()
