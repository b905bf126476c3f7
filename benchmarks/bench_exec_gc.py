"""The cyclic collector's share of an exec, with and without ``settle_heap``, in process.

The gateway app over a simulated node (its SQLite store and trajectory log real, no
container: nothing here needs root or the machine lock), 200 sandboxes, then ``--execs``
execs of ``["true"]`` with 32 in flight from an httpx client in the same process.
``gc.callbacks`` time every collection. Run once per mode, in fresh processes:
``python benchmarks/bench_exec_gc.py 0`` (as before) and ``... 1`` (settle_heap first).
The CPU per exec is the app's and the client's together.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import tempfile
import time
from pathlib import Path

import httpx

from dsec.cluster.local import LocalCluster
from dsec.gateway.app import create_app
from dsec.gateway.server import settle_heap
from dsec.node.backends.simulated import open_simulated_node

TOKEN = "dsec_bench-gc-token"
_gc = {"total": 0.0, "t0": 0.0}


def _timed(phase: str, info: dict) -> None:
    if phase == "start":
        _gc["t0"] = time.perf_counter()
    else:
        _gc["total"] += time.perf_counter() - _gc["t0"]


async def main(settle: bool, n: int) -> None:
    node = await open_simulated_node(Path(tempfile.mkdtemp(prefix="dsec-bench-gc-")))
    app = create_app(LocalCluster(node), TOKEN)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://t",
                                     headers={"authorization": f"Bearer {TOKEN}"}) as c:
            ids = []
            for _ in range(200):
                r = await c.post("/v1/sandboxes", json={"memory_mb": 64, "cpu": 0.05})
                r.raise_for_status()
                ids.append(r.json()["id"])
            if settle:
                settle_heap()
            gc.callbacks.append(_timed)
            p0 = time.process_time()

            async def worker(k: int) -> None:
                for i in range(k, n, 32):
                    r = await c.post(f"/v1/sandboxes/{ids[i % 200]}/exec",
                                     json={"cmd": ["true"]})
                    r.raise_for_status()

            await asyncio.gather(*(worker(k) for k in range(32)))
            cpu = time.process_time() - p0
    print(f"settle_heap={settle}: CPU per exec {cpu / n * 1e6:.0f} µs, of which the "
          f"collector {_gc['total'] / n * 1e6:.1f} µs ({_gc['total'] / cpu * 100:.1f} %)")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("settle", choices=["0", "1"])
    p.add_argument("--execs", type=int, default=4000)
    a = p.parse_args()
    asyncio.run(main(a.settle == "1", a.execs))
