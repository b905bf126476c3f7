"""KSM for containers: host memory per extra python sandbox, without and with merging.

Two rounds on in-process nodes: ``density.ksm=False`` (the baseline: dsec before) and
``density.ksm=True`` (the sandbox's init, and so every process, PR_SET_MEMORY_MERGE). Each
round starts N python:3.11 sandboxes whose process imports the same modules and sleeps,
lets ksmd scan (pages_to_scan raised for the run, restored after), and reports the drop in
MemAvailable per sandbox and KSM's pages_sharing.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

import common

from dsec.api.models import ExecRequest, SandboxSpec
from dsec.node.config import NodeConfig
from dsec.node.density.config import DensityConfig
from dsec.node.host.procfs import pss
from dsec.node.service import NodeService
from tests.support.images import ensure_debian_image

KSM = Path("/sys/kernel/mm/ksm")
IMPORTS = ("import asyncio, json, email, http.client, sqlite3, decimal, xml.dom.minidom, "
           "unittest, argparse, logging, pathlib, subprocess, typing, dataclasses, csv, "
           "zipfile, tarfile, difflib, pydoc; import time; open('/tmp/up','w'); "
           "time.sleep(10**6)")


def ksm(name: str) -> int:
    return int((KSM / name).read_text())


def ksm_stat(pid: int) -> dict[str, int]:
    """/proc/<pid>/ksm_stat (Linux >= 6.1): this process's merged pages and KSM profit."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/ksm_stat").read_text().splitlines():
            k, _, v = line.partition(" ")
            if v.strip().lstrip("-").isdigit():
                out[k] = int(v)
    except OSError:
        pass
    return out


async def round_(state: Path, n: int, merge: bool, settle_s: float) -> dict:
    cfg = NodeConfig(state_dir=state, backends=["container"],
                     density=DensityConfig(ksm=merge, reclaim_on_pause=False))
    node = await NodeService.open(cfg)
    try:
        common.drop_caches()
        time.sleep(2)
        avail0, share0 = common.mem_available(), ksm("pages_sharing")
        spec = SandboxSpec(image="python:3.11", memory_mb=256, cpu=0.1, ttl_s=None)
        ids = [(await node.create(spec)).id for _ in range(n)]
        for i in ids:
            await node.exec(i, ExecRequest(cmd=["python3", "-c", IMPORTS], background=True))
        for i in ids:
            await node.exec(i, ExecRequest(cmd=["sh", "-c", "while [ ! -f /tmp/up ]; do "
                                                "sleep 0.1; done"], timeout=120))
        await asyncio.sleep(settle_s)
        common.drop_caches()
        time.sleep(2)
        used = common.mem_available()
        backend = node.backends["container"]
        pids = [p for i in ids for p in backend.cgroups.procs(backend.cgroup_path(i))]
        stats = [ksm_stat(p) for p in pids]
        return {"per_sb_mib": (avail0 - used) / n / (1 << 20),
                "pss_mib": sum(pss(p) for p in pids) / n / (1 << 20),
                "merged_mib": sum(s.get("ksm_merging_pages", 0) for s in stats) * 4096
                / n / (1 << 20),
                "profit_mib": sum(s.get("ksm_process_profit", 0) for s in stats) / n / (1 << 20),
                "sharing_mib": (ksm("pages_sharing") - share0) * 4096 / (1 << 20)}
    finally:
        await node.close(stop_sandboxes=True)


def main() -> None:
    args = common.parse_args(__doc__)
    n = 4 if args.quick else 20
    settle = 10 if args.quick else 40
    old = (KSM / "pages_to_scan").read_text().strip()
    (KSM / "pages_to_scan").write_text("2000")  # 400 MB/s: merges within the settle time
    try:
        with tempfile.TemporaryDirectory(prefix="dsec-bench-") as tmp:
            ensure_debian_image(Path(tmp))
            base = asyncio.run(round_(Path(tmp), n, False, settle))
            new = asyncio.run(round_(Path(tmp), n, True, settle))
    finally:
        (KSM / "pages_to_scan").write_text(old)
    rows = [[name, str(n), f"{r['pss_mib']:.1f}", f"{r['merged_mib']:.1f}",
             f"{r['profit_mib']:.1f}", f"{r['per_sb_mib']:.1f}", f"{r['sharing_mib']:.0f}"]
            for name, r in (("no merging (baseline)", base), ("PR_SET_MEMORY_MERGE", new))]
    rows[1].append(f"{new['pss_mib'] / base['pss_mib']:.2f}x")
    rows[0].append("1.00x")
    notes = [f"{n} python:3.11 sandboxes, each a python3 that imported the same 19 stdlib "
             f"modules and sleeps; {settle} s for ksmd (pages_to_scan 2000, restored after).",
             "Pss per sandbox: the sandbox processes' proportional set size / N (a page KSM "
             "merged counts once, split over its sharers); merged and KSM profit: "
             "/proc/<pid>/ksm_stat (ksm_merging_pages, ksm_process_profit) / N; MemAvailable "
             "drop / N is host-wide and moved by other users of the shared machine (noise at "
             "this size); KSM sharing: the host's pages_sharing growth (guests included)."]
    body = common.table(["merging", "n", "Pss MiB per sandbox", "merged MiB per sandbox",
                         "KSM profit MiB per sandbox", "MemAvailable drop MiB per sandbox",
                         "KSM sharing MiB", "Pss vs baseline"], rows)
    common.publish("density_ksm-quick" if args.quick else "density_ksm",
                   "KSM for container sandboxes (issue 12)", body, notes)


if __name__ == "__main__":
    main()
