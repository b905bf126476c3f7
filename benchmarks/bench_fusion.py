"""SandboxFusion's client against dsec: `run_code("print(1+1)")`, p50 and calls/s with 16 in
flight, beside SandboxFusion's own approach to a call (a fresh interpreter in a new process:
`python3 -c` on the host, and the same inside `bwrap` with every namespace unshared).

The client is the unmodified `sandbox-fusion` package (its blocking `run_code`, one HTTP
request per call with no kept-alive connection, as verl calls it), 16 threads. The dsec SDK's
own `fncall` on the same server is shown for the cost of the SandboxFusion layer. Baselines
run the same 16 at a time on the same Debian image (its EROFS layer, read-only, as the root).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import common
import sandbox_fusion as sf

import dsec
from dsec.images import ImageService

IMAGE = "python:3.11"
CODE = "print(1+1)"
IN_FLIGHT = 16
# the system interpreter, not a version manager's shim (pyenv's adds ~90 ms of bash per call)
PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable


def fusion_once(endpoint: str) -> None:
    r = sf.run_code(sf.RunCodeRequest(code=CODE, language="python"), endpoint=endpoint,
                    max_attempts=1)
    assert r.run_result.stdout == "2\n", r


def python_once() -> None:
    out = subprocess.run([PYTHON, "-c", CODE], stdin=subprocess.DEVNULL,
                         capture_output=True, text=True)
    assert out.stdout == "2\n", out.stderr


def bwrap_once(rootfs: Path) -> None:
    out = subprocess.run(["bwrap", "--ro-bind", str(rootfs), "/", "--proc", "/proc", "--dev",
                          "/dev", "--tmpfs", "/tmp", "--unshare-all", "--die-with-parent",
                          "--new-session", "python3", "-c", CODE],
                         stdin=subprocess.DEVNULL, capture_output=True, text=True)
    assert out.stdout == "2\n", out.stderr


def measure(fn, n_seq: int, n_rate: int) -> dict:
    """Sequential latencies, then ``n_rate`` calls with IN_FLIGHT threads: rate and the
    latencies under that load."""
    seq = []
    for _ in range(n_seq):
        t0 = time.perf_counter()
        fn()
        seq.append(time.perf_counter() - t0)

    def timed(_):
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    with ThreadPoolExecutor(IN_FLIGHT) as pool:
        t0 = time.perf_counter()
        loaded = list(pool.map(timed, range(n_rate)))
        rate = n_rate / (time.perf_counter() - t0)
    return {"seq": seq, "loaded": loaded, "rate": rate}


async def sdk_measure(srv, n_seq: int, n_rate: int) -> dict:
    async with dsec.AsyncClient(srv.url, srv.token, timeout=600) as c:
        async def once() -> float:
            t0 = time.perf_counter()
            r = await c.fncall(CODE, image=IMAGE, memory_mb=1024, disk_mb=512, pids=512)
            assert r.stdout == "2\n", r
            return time.perf_counter() - t0

        seq = [await once() for _ in range(n_seq)]
        gate = asyncio.Semaphore(IN_FLIGHT)

        async def gated() -> float:
            async with gate:
                return await once()

        t0 = time.perf_counter()
        loaded = await asyncio.gather(*(gated() for _ in range(n_rate)))
        return {"seq": seq, "loaded": list(loaded), "rate": n_rate / (time.perf_counter() - t0)}


def row(name: str, m: dict, base: float) -> list[object]:
    p = common.percentile
    return [name, common.fmt_ms(p(m["seq"], 50)), common.fmt_ms(p(m["loaded"], 50)),
            common.fmt_ms(p(m["loaded"], 90)), f"{m['rate']:.0f}",
            common.ratio(m["rate"], base)]


def main() -> None:
    args = common.parse_args(__doc__)
    n_seq, n_rate = (20, 64) if args.quick else (200, 800)
    srv = common.ServerProcess(backends=["container", "fncall"])
    subprocess.run([sys.executable, str(common.ROOT / "scripts" / "build_debian_image.py"),
                    "--state-dir", str(srv.state_dir)], check=True, stdout=subprocess.DEVNULL)
    try:
        srv.start()
        endpoint = f"{srv.url}/sandboxfusion/{srv.token}"
        for _ in range(20):  # start the pool and probe the image's languages
            fusion_once(endpoint)
        fusion = measure(lambda: fusion_once(endpoint), n_seq, n_rate)
        sdk = asyncio.run(sdk_measure(srv, n_seq, n_rate))
        rootfs = ImageService(srv.state_dir).resolve(IMAGE).lowerdirs[0]
        py = measure(python_once, n_seq, n_rate)
        bw = measure(lambda: bwrap_once(rootfs), n_seq, n_rate)
    finally:
        srv.stop()
        left = common.leftover_report(srv)
        srv.destroy()
    base = py["rate"]
    rows = [row("sandbox-fusion client → dsec /sandboxfusion/run_code", fusion, base),
            row("dsec SDK fncall, same server and pool (reference)", sdk, base),
            row(f"{PYTHON} -c per call, host (SandboxFusion's approach, no isolation)", py,
                base),
            row("bwrap + python3 -c per call (SandboxFusion's approach, isolated)", bw, base)]
    body = common.table(["print(1+1)", "p50 ms alone", f"p50 ms, {IN_FLIGHT} in flight",
                         f"p90 ms, {IN_FLIGHT} in flight", "calls/s", "calls/s / python3 -c"],
                        rows)
    notes = [f"{n_seq} sequential calls, then {n_rate} calls {IN_FLIGHT} at a time, per row",
             "dsec: each call in a fresh fork of a warm interpreter, an unprivileged uid in a "
             "runc worker (no network, cgroup, rlimits), reset after the call; 4 workers "
             "per pool on 2 cores",
             "sandbox-fusion's run_code opens a new HTTP connection per call (requests.post)"]
    if left:
        notes.append(f"LEFTOVERS: {left}")
    name = "fusion-quick" if args.quick else "fusion"
    common.publish(name, "SandboxFusion run_code through its own client", body, notes)


if __name__ == "__main__":
    main()
