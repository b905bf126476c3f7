"""Exec through a gateway over a real Ray cluster, beside the embedded server (issue 15).

A three-raylet Ray cluster on this machine, a dsec node agent on each raylet (a Ray actor
with its own HTTP API), and a gateway in its own process over them; beside it, in the same
run, the embedded server (`dsec serve`: gateway and node in one process). The same client
code runs `true` on both: sequential round trips, then a burst with 32 in flight over
the sandboxes. All of it shares this machine's 2 cores.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common

import dsec
from tests.support.server import free_port

TOKEN = "dsec_bench_ray_token"


def ray_cluster():
    import ray
    from ray.cluster_utils import Cluster
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 1, "resources": {"machine-a": 1}})
    for m in "bc":
        cluster.add_node(num_cpus=1, resources={f"machine-{m}": 1})
    ray.init(address=cluster.address, namespace="dsec", log_to_driver=False)
    return cluster


def gateway_process(address: str, state: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    for name in ("token", "cluster_token"):  # the node actors were given TOKEN as the
        (state / name).write_text(TOKEN)      # cluster credential
        os.chmod(state / name, 0o600)
    proc = subprocess.Popen([sys.executable, "-m", "dsec.gateway.server", "--ray", address,
                             "--state-dir", str(state), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    import httpx
    for _ in range(600):
        try:
            if httpx.get(f"{url}/healthz", timeout=1).json().get("nodes") == 3:
                return proc, url
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("the Ray gateway did not see three nodes")


async def measure(url: str, token: str, n_seq: int, n_burst: int, sandboxes: int) -> dict:
    async with dsec.AsyncClient(url, token, timeout=120) as c:
        sbs = await c.create_many(sandboxes, memory_mb=64, cpu=0.1)
        try:
            for sb in sbs[:4]:
                await sb.exec(["true"])
            seq = []
            for i in range(n_seq):
                t0 = time.perf_counter()
                r = await sbs[i % len(sbs)].exec(["true"])
                seq.append(time.perf_counter() - t0)
                assert r.exit_code == 0
            sem = asyncio.Semaphore(32)
            lat: list[float] = []

            async def one(i: int) -> None:
                async with sem:
                    t0 = time.perf_counter()
                    r = await sbs[i % len(sbs)].exec(["true"])
                    lat.append(time.perf_counter() - t0)
                    assert r.exit_code == 0
            t0 = time.perf_counter()
            await asyncio.gather(*(one(i) for i in range(n_burst)))
            wall = time.perf_counter() - t0
            nodes = len({s.info.node for s in sbs})
        finally:
            await asyncio.gather(*(s.stop() for s in sbs))
    burst = {**common.summary(lat), "p99": common.percentile(lat, 99)}
    return {"seq": common.summary(seq), "burst": burst,
            "rate": n_burst / wall, "nodes": nodes}


def main(quick: bool) -> None:
    import ray

    from dsec.cluster.ray import start_node_actor
    n_seq, n_burst, sandboxes = (50, 200, 12) if quick else (300, 2000, 30)
    cluster = ray_cluster()
    dirs = [Path(tempfile.mkdtemp(prefix="dsec-bench-ray-")) for _ in range(3)]
    gw_state = Path(tempfile.mkdtemp(prefix="dsec-bench-gw-"))
    actors = []
    gw = None
    try:
        actors = [start_node_actor(d, TOKEN, resources={f"machine-{m}": 0.01})
                  for d, m in zip(dirs, "abc")]
        gw, url = gateway_process(cluster.address, gw_state)
        ray_fig = asyncio.run(measure(url, TOKEN, n_seq, n_burst, sandboxes))
        with common.server() as srv:
            embedded = asyncio.run(measure(srv.url, srv.token, n_seq, n_burst, sandboxes))
        left = srv.left
    finally:
        if gw is not None:
            gw.terminate()
            gw.wait(10)
        for a in actors:
            ray.get(a.actor.shutdown.remote())
            ray.kill(a.actor)
        ray.shutdown()
        cluster.shutdown()
        for d in [*dirs, gw_state]:
            shutil.rmtree(d, ignore_errors=True)
    rows = []
    for name, f in (("gateway over Ray, 3 node agents", ray_fig),
                    ("embedded server (baseline)", embedded)):
        rows.append([name, f["nodes"], common.fmt_ms(f["seq"]["p50"]),
                     common.fmt_ms(f["seq"]["p90"]), f"{f['rate']:.0f}",
                     common.fmt_ms(f["burst"]["p50"]), common.fmt_ms(f["burst"]["p99"])])
    body = common.table(["path", "nodes used", "sequential p50 ms", "sequential p90 ms",
                         "execs/s, 32 in flight", "burst p50 ms", "burst p99 ms"], rows)
    ratio = common.ratio(ray_fig["seq"]["p50"], embedded["seq"]["p50"])
    notes = [f"Sequential p50 through the Ray gateway / embedded: {ratio} (one more HTTP "
             "hop: client → gateway → node API).",
             f"{n_seq} sequential execs of `true`, then {n_burst} with 32 in flight, over "
             f"{sandboxes} busybox sandboxes (64 MiB each).",
             "Three raylets, three node agents, the gateway process and the client all share "
             "this machine's 2 cores.",
             "Cleanup after stop: " + ("nothing left" if not left else ", ".join(left))]
    name = "ray-quick" if quick else "ray"
    common.publish(name, "Exec through a gateway over Ray vs the embedded server"
                   + (" (quick)" if quick else ""), body, notes)


if __name__ == "__main__":
    args = common.parse_args(__doc__)
    main(args.quick)
