"""A sandbox's ``get`` on a node: the memory read on the loop against a thread hop.

``GET /v1/sandboxes/{id}`` reports the memory the sandbox is charged for now. A backend
whose read is a counter the kernel keeps (a container's cgroup file; the simulated
backend reads nothing) is read on the node's event loop; before, every ``get`` handed the
read to a thread and waited for it. Measured in process, the node's own API app (the
gateway app over one node) called through ASGI with no socket, over a simulated node
(real NodeService, SQLite store and trajectory log; no process runs), on the event loop a
node agent runs (uvloop when installed): the same requests
with the backend's ``memory_read_is_cheap`` as it is (now) and turned off (the baseline,
the thread hop), in interleaved rounds. Wall time and this process's CPU time per get.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import common

from dsec.cluster.local import LocalCluster
from dsec.gateway.app import create_app
from dsec.gateway.server import run_loop
from dsec.node.backends.simulated import SimulatedBackend, open_simulated_node

TOKEN = "dsec_bench_node_get_token"
HEADERS = [(b"host", b"bench"), (b"authorization", f"Bearer {TOKEN}".encode())]


async def _call(app, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
    headers = HEADERS + ([(b"content-type", b"application/json"),
                          (b"content-length", str(len(body)).encode())] if body else [])
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "headers": headers,
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2), "state": {}}
    sent = False
    out: list[dict] = []

    async def receive():
        nonlocal sent
        if sent:
            await asyncio.Event().wait()  # the client never leaves
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(msg):
        out.append(msg)

    await app(scope, receive, send)
    return out[0]["status"], b"".join(m.get("body", b"") for m in out[1:])


async def _round(app, path: str, n: int) -> tuple[float, float]:
    w, c = time.perf_counter(), time.process_time()
    for _ in range(n):
        status, body = await _call(app, "GET", path)
        if status != 200:
            raise RuntimeError(f"get: {status} {body[:200]!r}")
    return (time.perf_counter() - w) / n, (time.process_time() - c) / n


async def main(rounds: int, n: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        node = await open_simulated_node(Path(d))
        app = create_app(LocalCluster(node), TOKEN, close_cluster=False, node_api=True)
        try:
            async with app.router.lifespan_context(app):
                status, body = await _call(app, "POST", "/v1/sandboxes",
                                           json.dumps({"cpu": 0.05, "memory_mb": 64}).encode())
                if status != 201:
                    raise RuntimeError(f"create: {status} {body[:200]!r}")
                path = f"/v1/sandboxes/{json.loads(body)['id']}"
                await _round(app, path, n // 10)  # warm-up
                got: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
                for _ in range(rounds):
                    for cheap in (False, True):
                        SimulatedBackend.memory_read_is_cheap = cheap
                        got[cheap].append(await _round(app, path, n))
                SimulatedBackend.memory_read_is_cheap = True
                await _call(app, "DELETE", path)
        finally:
            SimulatedBackend.memory_read_is_cheap = True
            await node.close()
    med = {k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v))
           for k, v in got.items()}
    rows = [["the read in a thread (`asyncio.to_thread`; baseline)",
             f"{med[False][0] * 1e6:.0f}", f"{med[False][1] * 1e6:.0f}", "1.00×"],
            ["the read on the loop (now, for container and simulated sandboxes)",
             f"{med[True][0] * 1e6:.0f}", f"{med[True][1] * 1e6:.0f}",
             common.ratio(med[True][0], med[False][0])]]
    common.publish("node_get", "A sandbox's get on a node: memory read on the loop vs a thread",
                   common.table(["path", "µs per get (wall)", "CPU µs per get", "wall vs baseline"],
                                rows),
                   [f"medians of {rounds} interleaved rounds of {n:,} sequential gets of one "
                    "sandbox; the node's API app called through ASGI in this process (no "
                    "socket, no HTTP parsing), over a simulated node",
                    "the baseline is this tree with the backend's `memory_read_is_cheap` "
                    "turned off, which is the code path every get took before",
                    "a microVM guest's read (its QEMU's smaps_rollup) still goes to a thread"])


if __name__ == "__main__":
    args = common.parse_args(__doc__)
    run_loop(main(3 if args.quick else 7, 300 if args.quick else 3000))  # the server's loop
