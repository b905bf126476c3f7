"""How many python sandboxes fit: a 40 MiB working set each, idle 90 % of the time,
added until the node refuses; idle reclaim + KSM versus neither, in the same run.

Two rounds on in-process nodes (python:3.11, memory_mb=64, cpu=0.1 each):

- baseline: no KSM, no idle reclaim, no zram of the node's (dsec before issue 12);
- reclaim + KSM: ``idle_reclaim_s`` short (the node default is 300 s; a run cannot wait
  that long per sandbox), the node's zram sized for the round, PR_SET_MEMORY_MERGE.

Each sandbox runs a python process holding a 40 MiB working set: every 4 KiB page 1 KiB
of random bytes and 3 KiB of zeros, so it is the sandbox's own (KSM finds nothing to merge
in it) and compresses about 3.5x (what zram holds of it). A *step* (the agent using the
sandbox) is one exec that signals the process to hash its whole working set and waits for
the digest: every page is touched. Sandboxes are added in batches; after each batch a
random 10 % of all sandboxes take a step (idle 90 % of the time). A round ends when the
node refuses (admission: its reason is recorded), when MemAvailable falls under the
run's guard (the machine is shared: the run never pushes it into real memory pressure),
or when its time budget ends. Then the round settles, takes its figures (host memory per
sandbox: MemAvailable drop / N; cgroup charge; what zram holds), steps a sample to time a
step on a reclaimed sandbox and check its digest, and stops everything.

Where a round stops on the guard or the budget, the count at which admission would refuse
is *extrapolated* from the per-sandbox figure (and labelled so): MemAvailable left, less
the policy's ``min_free_mb``, over host memory per sandbox.
"""

from __future__ import annotations

import asyncio
import os
import random
import tempfile
import time
from pathlib import Path

import common

from dsec.api.errors import Capacity
from dsec.api.models import ExecRequest, SandboxSpec
from dsec.node.config import NodeConfig
from dsec.node.density.config import DensityConfig, SwapConfig
from dsec.node.service import NodeService
from tests.support.images import ensure_debian_image

KSM = Path("/sys/kernel/mm/ksm")
WS_MB = 40
HOLDER = f"""
import hashlib, os, signal
buf = bytearray({WS_MB} << 20)
for off in range(0, len(buf), 4096):
    buf[off:off + 1024] = os.urandom(1024)
signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGUSR1}})
open('/tmp/sum0', 'w').write(hashlib.sha256(buf).hexdigest())
open('/tmp/pid', 'w').write(str(os.getpid()))
while True:
    signal.sigwait({{signal.SIGUSR1}})
    d = hashlib.sha256(buf).hexdigest()
    open('/tmp/sum.t', 'w').write(d)
    os.rename('/tmp/sum.t', '/tmp/sum')
"""
UP = "while [ ! -s /tmp/pid ]; do sleep 0.05; done; cat /tmp/sum0"
STEP = ("rm -f /tmp/sum; kill -USR1 $(cat /tmp/pid); "
        "while [ ! -s /tmp/sum ]; do sleep 0.01; done; cat /tmp/sum")
SPEC = SandboxSpec(image="python:3.11", memory_mb=64, cpu=0.1, ttl_s=None)
BATCH = 25


def zram_used() -> int:
    """Memory every zram device holds now (mm_stat mem_used_total), in bytes."""
    total = 0
    for d in Path("/sys/block").glob("zram*"):
        try:
            total += int((d / "mm_stat").read_text().split()[2])
        except (OSError, IndexError, ValueError):
            pass
    return total


def settled_avail() -> int:
    common.drop_caches()
    time.sleep(1)
    return int(common.percentile([common.mem_available() for _ in range(3)], 50))


async def start_one(node: NodeService) -> tuple[str, str]:
    sb = await node.create(SPEC)
    await node.exec(sb.id, ExecRequest(cmd=["python3", "-c", HOLDER], background=True))
    r = await node.exec(sb.id, ExecRequest(cmd=["sh", "-c", UP], timeout=120))
    return sb.id, r.stdout.decode().strip() if isinstance(r.stdout, bytes) else r.stdout.strip()


async def step(node: NodeService, sb_id: str) -> tuple[float, str]:
    t0 = time.perf_counter()
    r = await node.exec(sb_id, ExecRequest(cmd=["sh", "-c", STEP], timeout=120))
    out = r.stdout.decode() if isinstance(r.stdout, bytes) else r.stdout
    return time.perf_counter() - t0, out.strip()


def cgroup_bytes(node: NodeService, ids: list[str]) -> int:
    backend = node.backends["container"]
    return sum(backend.memory_bytes(node.records[i]) for i in ids)


async def round_(state: Path, reclaim: bool, cap: int, guard_mb: int, budget_s: float,
                 idle_s: float, settle_s: float, zram_mb: int) -> dict:
    density = DensityConfig(
        ksm=reclaim, reclaim_on_pause=reclaim,
        idle_reclaim_s=idle_s if reclaim else None, idle_reclaim_interval_s=1.0,
        swap=SwapConfig(zram_mb=min(zram_mb, cap * (WS_MB + 8)) if reclaim else 0))
    node = await NodeService.open(NodeConfig(state_dir=state, backends=["container"],
                                             density=density))
    ids: list[str] = []
    sums: dict[str, str] = {}
    why, trace = "", []
    try:
        avail0, zram0 = settled_avail(), zram_used()
        t0 = time.perf_counter()
        while len(ids) < cap:
            if time.perf_counter() - t0 > budget_s:
                why = f"time budget ({budget_s:g} s)"
                break
            if common.mem_available() < guard_mb << 20:
                why = f"the run's guard: MemAvailable under {guard_mb} MiB"
                break
            got = await asyncio.gather(*(start_one(node) for _ in range(min(BATCH,
                                                                          cap - len(ids)))),
                                       return_exceptions=True)
            for g in got:
                if isinstance(g, tuple):
                    ids.append(g[0])
                    sums[g[0]] = g[1]
                elif isinstance(g, Capacity) and not why:
                    why = f"admission refused: {g}"
                elif not why:
                    why = f"{type(g).__name__}: {g}"
            if why:
                break
            active = random.sample(ids, max(1, len(ids) // 10))
            await asyncio.gather(*(step(node, i) for i in active))
            trace.append((len(ids), round(time.perf_counter() - t0),
                          (avail0 - common.mem_available()) >> 20))
            if len(ids) % 100 < BATCH:
                print(f"{'reclaim' if reclaim else 'baseline'}: {len(ids)} sandboxes, "
                      f"{time.perf_counter() - t0:.0f} s, host -{trace[-1][2]} MiB, "
                      f"load {common.load()}", flush=True)
        t_fill = time.perf_counter() - t0
        await asyncio.sleep(settle_s)  # idle reclaim catches up with the last batches
        n = len(ids)
        avail = settled_avail()
        cg, zram = cgroup_bytes(node, ids), zram_used() - zram0
        sample = random.sample(ids, min(50, n))
        steps = [await step(node, i) for i in sample]
        intact = sum(d == sums[i] for i, (_, d) in zip(sample, steps))
        per = (avail0 - avail) / max(n, 1)
        free_mb = node.load().memory_available_mb or 0
        swap_free = node.load().swap_free_mb or 0
        policy = node.config.admission
        return {"n": n, "why": why or f"reached --count {cap}", "t_fill": t_fill,
                "per_mib": per / (1 << 20), "cg_mib": cg / max(n, 1) / (1 << 20),
                "zram_mib": zram / max(n, 1) / (1 << 20),
                "step_p50": common.percentile([s for s, _ in steps], 50),
                "step_max": max(s for s, _ in steps), "intact": f"{intact}/{len(sample)}",
                "avail_mb": avail >> 20, "swap_free_mb": swap_free, "free_mb": free_mb,
                "extra": max(0, ((avail >> 20) - policy.min_free_mb) / max(per / (1 << 20),
                                                                            1e-9)),
                "trace": trace}
    finally:
        await node.close(stop_sandboxes=True)


def main() -> None:
    args = common.parse_args(__doc__, lambda p: (
        p.add_argument("--count", type=int, default=3200, help="most sandboxes per round"),
        p.add_argument("--guard-mb", type=int, default=6144,
                       help="stop adding when MemAvailable falls under this (shared machine)"),
        p.add_argument("--budget-s", type=float, default=480, help="filling time per round"),
        p.add_argument("--idle-s", type=float, default=20.0,
                       help="idle_reclaim_s of the reclaim round"),
        p.add_argument("--settle-s", type=float, default=60.0),
        p.add_argument("--zram-mb", type=int, default=65536,
                       help="the reclaim round's zram (what it holds uncompressed; its "
                            "page table costs ~4 MiB of RAM per GiB)")))
    cap = 20 if args.quick else args.count
    load0 = common.load()
    old = (KSM / "pages_to_scan").read_text().strip()
    (KSM / "pages_to_scan").write_text("1000")  # ksmd at 200 MB/s for the run, restored after
    try:
        with tempfile.TemporaryDirectory(prefix="dsec-bench-") as tmp:
            ensure_debian_image(Path(tmp))
            base = asyncio.run(round_(Path(tmp), False, cap, args.guard_mb, args.budget_s,
                                      args.idle_s, 10 if args.quick else 20, 0))
            new = asyncio.run(round_(Path(tmp), True, cap, args.guard_mb, args.budget_s,
                                     args.idle_s, 20 if args.quick else args.settle_s,
                                     args.zram_mb))
    finally:
        (KSM / "pages_to_scan").write_text(old)
    rows = []
    for name, r in (("no reclaim, no KSM (baseline)", base), ("idle reclaim + KSM", new)):
        rows.append([name, str(r["n"]), r["why"], f"{r['t_fill']:.0f}",
                     f"{r['per_mib']:.1f}", f"{r['cg_mib']:.1f}", f"{r['zram_mib']:.1f}",
                     f"{r['step_p50'] * 1e3:.0f} / {r['step_max'] * 1e3:.0f}", r["intact"],
                     f"{r['avail_mb']} / {r['swap_free_mb']}",
                     f"{r['n'] + r['extra']:.0f}"])
    ratio = base["per_mib"] / new["per_mib"] if new["per_mib"] > 0 else float("nan")
    notes = [
        f"Ratio of host memory per sandbox, baseline / reclaim + KSM: {ratio:.2f}x; the "
        "count at which admission refuses scales with it.",
        "**Extrapolated** (last column, not run): N + (MemAvailable left - min_free_mb "
        f"{NodeConfig().admission.min_free_mb} MiB) / host memory per sandbox, i.e. where "
        "the node's memory guard would refuse if every further sandbox cost what these did.",
        f"python:3.11, memory_mb={SPEC.memory_mb}, cpu={SPEC.cpu}; working set {WS_MB} MiB "
        "per sandbox (1 KiB random + 3 KiB zeros per page); batches of "
        f"{BATCH}, a random 10 % of the sandboxes stepped after each; idle_reclaim_s "
        f"{args.idle_s:g} s in the reclaim round (node default 300 s); settle "
        f"{args.settle_s:g} s; guard {args.guard_mb} MiB MemAvailable; ksmd pages_to_scan "
        "1000 for the run (restored after).",
        "host memory per sandbox: MemAvailable drop / N, caches dropped; cgroup: the "
        "sandboxes' own charge / N; zram: growth of zram's mem_used_total / N (the "
        "compressed copies); step: one exec that hashes the whole working set (50 sampled "
        "after the settle); intact: digest equal to the one taken at start.",
        f"Load average: start {load0}, end {common.load()}.",
        "Fill traces (sandboxes, s, MiB MemAvailable drop): baseline "
        f"{base['trace'][::4]}; reclaim {new['trace'][::4]}.",
    ]
    body = common.table(["round", "sandboxes", "stopped by", "fill s",
                         "host MiB per sandbox", "cgroup MiB per sandbox",
                         "zram MiB per sandbox", "step p50 / max ms", "intact",
                         "MemAvailable / swap free MiB at the end",
                         "admission would refuse at (extrapolated)"], rows)
    common.publish("density_count-quick" if args.quick else "density_count",
                   "How many python sandboxes fit: 40 MiB working sets, idle 90 % "
                   "(issue 12)", body, notes)


if __name__ == "__main__":
    main()
