"""fncall: `print(1+1)` calls/s and p50 latency, beside a fresh container and bwrap per call.

Targets (issue 4): >= 300 calls/s and p50 <= 10 ms on 2 cores. Baselines, run in the same
process on the same Debian image (its EROFS layer mount used read-only as the root):
`runc run` of a new container per call running `python3 -c 'print(1+1)'`, and `bwrap` with
every namespace unshared per call. Last, a judge-style batch: 1,000 calls, each a solution
checked against 5 test cases, sent as one `fncall_many` request.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import common

import dsec
from dsec.api.fncall import FnCallRequest
from dsec.images import ImageService

IMAGE = "python:3.11"
CODE = "print(1+1)"
SOLUTION = "def solve(a, b):\n    return a + b\n"
JUDGE = SOLUTION + """
cases = [((1, 2), 3), ((5, 7), 12), ((-1, 1), 0), ((10**9, 10**9), 2 * 10**9), ((0, 0), 0)]
passed = sum(solve(*args) == want for args, want in cases)
print(f"{passed}/{len(cases)}")
"""


# ---- dsec fncall ----
async def fncall_sequential(c: dsec.AsyncClient, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = await c.fncall(CODE, image=IMAGE)
        out.append(time.perf_counter() - t0)
        assert r.stdout == "2\n", r
    return out


async def fncall_concurrent(c: dsec.AsyncClient, n: int, conc: int) -> float:
    async def worker(k: int) -> None:
        for _ in range(k):
            r = await c.fncall(CODE, image=IMAGE)
            assert r.stdout == "2\n", r

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(n // conc) for _ in range(conc)))
    return (n // conc * conc) / (time.perf_counter() - t0)


async def fncall_batch(c: dsec.AsyncClient, code: str, n: int, want: str) -> float:
    t0 = time.perf_counter()
    outs = await c.fncall_many([FnCallRequest(code=code, image=IMAGE) for _ in range(n)])
    wall = time.perf_counter() - t0
    bad = [o for o in outs if o.stdout != want]
    assert not bad, bad[:2]
    return wall


# ---- baselines ----
def runc_bundle(tmp: Path, rootfs: Path) -> Path:
    bundle = tmp / "bundle"
    bundle.mkdir()
    common.sh("runc", "spec", "--bundle", str(bundle))
    cfg = json.loads((bundle / "config.json").read_text())
    cfg["process"]["terminal"] = False
    cfg["process"]["args"] = ["python3", "-c", CODE]
    cfg["root"] = {"path": str(rootfs), "readonly": True}
    (bundle / "config.json").write_text(json.dumps(cfg))
    return bundle


def runc_once(runc_root: Path, bundle: Path, cid: str) -> None:
    out = subprocess.run(["runc", "--root", str(runc_root), "run", "-b", str(bundle), cid],
                         stdin=subprocess.DEVNULL, capture_output=True, text=True)
    assert out.stdout == "2\n", out.stderr


def bwrap_once(rootfs: Path) -> None:
    out = subprocess.run(["bwrap", "--ro-bind", str(rootfs), "/", "--proc", "/proc", "--dev",
                          "/dev", "--tmpfs", "/tmp", "--unshare-all", "--die-with-parent",
                          "--new-session", "python3", "-c", CODE],
                         stdin=subprocess.DEVNULL, capture_output=True, text=True)
    assert out.stdout == "2\n", out.stderr


def measure(fn, n: int, conc: int) -> tuple[list[float], float]:
    """Per-call latencies (sequential) and calls/s with ``conc`` threads."""
    lat = []
    for i in range(n):
        t0 = time.perf_counter()
        fn(f"s{i}")
        lat.append(time.perf_counter() - t0)
    with ThreadPoolExecutor(conc) as pool:
        t0 = time.perf_counter()
        list(pool.map(fn, [f"p{i}" for i in range(n)]))
        rate = n / (time.perf_counter() - t0)
    return lat, rate


# ---- main ----
async def run_fncall(srv, n_seq: int, n_rate: int, n_batch: int) -> dict:
    async with dsec.AsyncClient(srv.url, srv.token, timeout=600) as c:
        await fncall_sequential(c, 20)  # warm the pool
        seq = await fncall_sequential(c, n_seq)
        rate = await fncall_concurrent(c, n_rate, 8)
        batch_print = await fncall_batch(c, CODE, n_rate, "2\n")
        judge = await fncall_batch(c, JUDGE, n_batch, "5/5\n")
    return {"seq": seq, "rate": rate, "batch_rate": n_rate / batch_print, "judge": judge}


def main() -> None:
    args = common.parse_args(__doc__)
    n_seq, n_rate, n_batch, n_base = (30, 100, 100, 10) if args.quick else \
        (300, 1000, 1000, 100)
    srv = common.ServerProcess(backends=["container", "fncall"])
    subprocess.run([sys.executable, str(common.ROOT / "scripts" / "build_debian_image.py"),
                    "--state-dir", str(srv.state_dir)], check=True, stdout=subprocess.DEVNULL)
    try:
        srv.start()
        fn = asyncio.run(run_fncall(srv, n_seq, n_rate, n_batch))
        rootfs = ImageService(srv.state_dir).resolve(IMAGE).lowerdirs[0]
        with tempfile.TemporaryDirectory() as tmp:
            bundle = runc_bundle(Path(tmp), rootfs)
            runc_root = Path(tmp) / "runc"
            runc_lat, runc_rate = measure(lambda cid: runc_once(runc_root, bundle, cid),
                                          n_base, 2)
        bw_lat, bw_rate = measure(lambda _: bwrap_once(rootfs), n_base, 2)
    finally:
        srv.stop()  # closes the pools: every worker container must be gone after this
        left = common.leftover_report(srv)
        srv.destroy()
    p50 = common.percentile
    rows = [
        ["dsec fncall (HTTP, warm pool)", common.fmt_ms(p50(fn["seq"], 50)),
         common.fmt_ms(p50(fn["seq"], 90)), f"{fn['rate']:.0f} (8 in flight)"],
        ["dsec fncall_many (one request)", "—", "—", f"{fn['batch_rate']:.0f}"],
        ["runc run + python3 -c, per call", common.fmt_ms(p50(runc_lat, 50)),
         common.fmt_ms(p50(runc_lat, 90)), f"{runc_rate:.0f} (2 in flight)"],
        ["bwrap + python3 -c, per call", common.fmt_ms(p50(bw_lat, 50)),
         common.fmt_ms(p50(bw_lat, 90)), f"{bw_rate:.0f} (2 in flight)"],
    ]
    body = common.table(["print(1+1)", "p50 ms", "p90 ms", "calls/s"], rows)
    body += (f"\n\nJudge-style batch: {n_batch} calls (a solution against 5 test cases each) "
             f"in one fncall_many: {fn['judge']:.2f} s wall "
             f"({n_batch / fn['judge']:.0f} calls/s).")
    notes = [f"{n_seq} sequential calls for latency; {n_rate} calls for the rates; "
             f"baselines {n_base} sequential + {n_base} with 2 threads",
             "every fncall runs in a fresh fork as an unprivileged uid inside a runc worker "
             "container (no network, cgroup + rlimits), leftovers killed and files wiped "
             "after each call"]
    if left:
        notes.append(f"LEFTOVERS: {left}")
    common.publish("fncall", "fncall: print(1+1) and a judge batch", body, notes)


if __name__ == "__main__":
    main()
