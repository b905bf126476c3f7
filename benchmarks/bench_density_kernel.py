"""Kernel memory per idle sandbox against the count: superblocks x memory cgroups (issue 12).

Every superblock registers a memcg-aware shrinker and the kernel keeps shrinker state for
each (memory cgroup, shrinker) pair, so N sandboxes of s superblocks each cost kernel slab
in O(s x N^2): per sandbox, slab grows with the count. Two rounds in one run, same node
code otherwise: the **old spec** (a tmpfs of its own for /dev/shm and for every masked
directory, patched in-process for that round) and the **new** one (/dev/shm in the rw tmpfs,
masked /sys dirs as binds of one empty directory, empty /proc dirs not masked). Each round
fills to N1 then N2 idle busybox sandboxes and reads /proc/meminfo Slab (caches dropped)
before, at N1 and at N2; slab(N) = a N + b N^2 is fitted through the two points and
extrapolated to 10,000. Then the mechanism alone: empty memory cgroups x empty tmpfs mounts,
nothing else, its cross term in bytes per (memcg, superblock) pair.
"""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
import time
from pathlib import Path

import common

from dsec.api.models import SandboxSpec
from dsec.node.backends import container
from dsec.node.config import NodeConfig
from dsec.node.host import mounts, oci
from dsec.node.service import NodeService
from tests.support.density import sandbox_superblocks

SPEC = SandboxSpec(memory_mb=32, cpu=0.1)
BATCH = 50
CG = Path("/sys/fs/cgroup")


def slab() -> int:
    """Median /proc/meminfo Slab of 5 reads after dropping caches twice."""
    common.drop_caches()
    time.sleep(1)
    common.drop_caches()
    reads = []
    for _ in range(5):
        reads.append(common.meminfo("Slab"))
        time.sleep(0.3)
    return int(common.percentile(reads, 50))


def old_spec(cfg: oci.ContainerConfig, **kw) -> dict:
    """The spec before the change: /dev/shm and every masked directory a tmpfs each."""
    old = dataclasses.replace(cfg, shm_dir=None, empty_dir=None,
                              masked_dirs=list(oci.MASKED_DIRS), hidden_dirs=[])
    return oci.build_config(old, **kw)



async def fill(node: NodeService, made: list[str], n: int) -> None:
    while len(made) < n:
        got, errors = await node.create_many(min(BATCH, n - len(made)), SPEC)
        made += [i.id for i in got]
        if errors:
            raise SystemExit(f"create_many at {len(made)}: {errors[0]}")


async def round_(tmp: Path, name: str, counts: tuple[int, int]) -> dict:
    node = await NodeService.open(NodeConfig(state_dir=tmp / name, backends=["container"]))
    made: list[str] = []
    out: dict = {}
    try:
        await node.stop((await node.create(SPEC)).id)  # warm: image mounted
        out["slab0"] = slab()
        t0 = time.perf_counter()
        for n in counts:
            await fill(node, made, n)
            out[n] = slab()
        out["fill_s"] = time.perf_counter() - t0
        out["superblocks"] = len(sandbox_superblocks(node, made[0]))
        print(f"{name}: {out}", flush=True)
    finally:
        await node.close(stop_sandboxes=True)
    out["end"] = slab()
    return out


def fit(r: dict, counts: tuple[int, int]) -> tuple[float, float]:
    """(a, b) of slab growth = a N + b N^2 through the two fill points."""
    n1, n2 = counts
    p1, p2 = (r[n1] - r["slab0"]) / n1, (r[n2] - r["slab0"]) / n2
    b = (p2 - p1) / (n2 - n1)
    return p1 - b * n1, b


# ---- the mechanism alone --------------------------------------------------------------

def _memcg_root() -> Path:
    if (CG / "cgroup.controllers").exists():
        return CG / "dsec-bench-shrinkers"
    return CG / "memory" / "dsec-bench-shrinkers"


def grid(tmp: Path, n_cg: int, n_fs: int) -> dict[str, int]:
    """Slab with (0|n_cg memcgs) x (0|n_fs tmpfs mounts), in the order base, cgroups,
    cgroups + mounts, mounts."""
    root, fs = _memcg_root(), tmp / "grid"
    fs.mkdir()
    out = {"base": slab()}
    root.mkdir()
    try:
        if (CG / "cgroup.controllers").exists():
            (root / "cgroup.subtree_control").write_text("+memory")
        for i in range(n_cg):
            (root / f"c{i}").mkdir()
        out["cg"] = slab()
        for i in range(n_fs):
            (fs / str(i)).mkdir()
            mounts.mount("tmpfs", fs / str(i), "tmpfs", mounts.MS_NOSUID | mounts.MS_NODEV,
                         "size=1m")
        out["cg+fs"] = slab()
        for i in range(n_cg):
            (root / f"c{i}").rmdir()
        out["fs"] = slab()
    finally:
        for i in range(n_cg):
            if (root / f"c{i}").exists():
                (root / f"c{i}").rmdir()
        root.rmdir()
        for target in mounts.mounts_under(fs):
            mounts.umount(target)
    return out


def mib(b: float) -> str:
    return f"{b / (1 << 20):.2f}"


def main() -> None:
    def extra(p):
        # N1 >= 7/11 N2, so the old round's first point is past the new round's peak
        p.add_argument("--counts", type=int, nargs=2, default=(1000, 1500))
    args = common.parse_args(__doc__, extra)
    counts = (50, 100) if args.quick else tuple(args.counts)
    n_cg, n_fs = (100, 200) if args.quick else (1000, 2000)
    load_before = common.load()
    got = {}
    with tempfile.TemporaryDirectory(prefix="dsec-bench-") as tmp:
        tmp = Path(tmp)
        # new first: the kernel never shrinks its per-memcg shrinker arrays (sized to the
        # highest shrinker id yet), so a round after the old one would pay for its peak
        got["new"] = asyncio.run(round_(tmp, "new", counts))
        new_build = container.build_config
        container.build_config = old_spec
        try:
            got["old"] = asyncio.run(round_(tmp, "old", counts))
        finally:
            container.build_config = new_build
        g = grid(tmp, n_cg, n_fs)
    n1, n2 = counts
    rows, at = [], {}
    for key, label in (("old", "old spec (baseline, patched in-process)"),
                       ("new", "new spec")):
        r = got[key]
        a, b = fit(r, counts)
        at[key] = a * 10_000 + b * 10_000 ** 2
        rows.append([label, str(r["superblocks"]),
                     mib((r[n1] - r["slab0"]) / n1), mib((r[n2] - r["slab0"]) / n2),
                     mib((r[n2] - r[n1]) / (n2 - n1)),
                     f"{mib(at[key] / 10_000)} ({at[key] / (1 << 30):.1f} GiB)",
                     f"{r['fill_s']:.0f}", mib(r["end"] - r["slab0"])])
    body = common.table(
        ["round", "superblocks per sandbox", f"slab per sandbox at {n1:,} MiB",
         f"at {n2:,} MiB", f"marginal {n1:,}->{n2:,} MiB",
         "extrapolated per sandbox at 10,000 MiB (total)", f"fill to {n2:,} s",
         "slab left after stop MiB"], rows)
    cross = g["cg+fs"] - g["cg"] - g["fs"] + g["base"]
    grown = {k: got[k][n2] - got[k]["slab0"] for k in got}
    notes = [
        f"Old/new ratio of slab per sandbox at {n2:,}: {grown['old'] / max(1, grown['new']):.2f}x;"
        f" at 10,000 (**extrapolated**, slab = aN + bN² through the two points): "
        f"{at['old'] / max(1, at['new']):.2f}x.",
        f"Mechanism alone: {n_cg:,} empty memory cgroups +{mib(g['cg'] - g['base'])} MiB, "
        f"{n_fs:,} empty tmpfs mounts +{mib(g['fs'] - g['base'])} MiB, both "
        f"+{mib(g['cg+fs'] - g['base'])} MiB: cross term {mib(cross)} MiB, "
        f"{cross / (n_cg * n_fs):.1f} bytes per (memcg, superblock) pair. It runs after the "
        "rounds, whose peak of shrinker ids its memcgs pay for at once: the new tmpfs reuse "
        f"freed ids below that peak, so the cross term is ~0 and {mib(g['cg'] - g['base'])} "
        f"MiB / {n_cg:,} memcgs is the per-memcg price of that peak "
        "(a fresh boot's grid would show the cross term instead).",
        "Old spec: the node's code with build_config swapped for one that resets shm_dir, "
        "empty_dir, masked_dirs and hidden_dirs to the pre-change defaults (a tmpfs for "
        "/dev/shm and each masked directory). Busybox, memory_mb=32, cpu=0.1, in-process node, "
        f"create_many batches of {BATCH}; Slab from /proc/meminfo, caches dropped, median "
        "of 5 reads; each round stops its sandboxes before the next starts.",
        "Per memory cgroup the kernel (6.x, mm/shrinker.c) keeps shrinker state sized to the "
        "highest shrinker id registered so far (a 1 KiB kmalloc per 64 ids), and never "
        "shrinks it: the cost is memcgs x the peak count of superblocks. So the new round "
        "runs first, and N1 >= 7/11 N2 puts the old round's first point past its peak.",
        f"Load average before the run: {load_before}.",
    ]
    common.publish("density_kernel-quick" if args.quick else "density_kernel",
                   "Kernel slab per idle sandbox: superblocks x memory cgroups (issue 12)",
                   body, notes)


if __name__ == "__main__":
    main()
