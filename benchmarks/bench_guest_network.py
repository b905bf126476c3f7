"""Egress by named permissions in microvm guests beside containers: the same rules, the cost.

A peer in its own network namespace serves HTTP; a node network config grants it as the
permission ``peer``. For a runc container and a microvm guest (its QEMU in the guest's own
namespace) the script measures, side by side:
  - granting the permission to a running sandbox (veth, addresses, nftables: one plumbing);
  - fetching from the peer, 20 times in one exec (each fetch starts ``nc``), per fetch,
    beside the same loop run on the host, which reaches the peer directly;
  - refusing a destination that was not granted (a TCP reset from the sandbox's rules).
Guests use TCG on a machine where nested KVM does not run (named in the output).

    .venv/bin/python benchmarks/capture.py guest_network "Egress in guests" -- \\
        benchmarks/bench_guest_network.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dsec.api.models import SandboxSpec
from dsec.images import ImageService
from dsec.node.agent.build import ensure_agent
from dsec.node.agent.client import AgentProcess, SpawnRequest
from dsec.node.backends.base import SandboxRecord
from dsec.node.backends.container import ContainerBackend
from dsec.node.backends.microvm import MicroVMBackend, MicroVMConfig
from dsec.node.host.netpolicy import NetworkManager

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # for tests.redteam.netpeer when run as a plain script
    sys.path.insert(0, str(ROOT))
from tests.redteam.netpeer import PEER, PEER_PORT, Peer  # noqa: E402

SUBNET = "10.217.0.0/24"  # the benchmark node's sandboxes (apart from the tests' nodes)
FETCHES = 20
LOOP = (f"i=0; while [ $i -lt {FETCHES} ]; do printf 'GET / HTTP/1.0\\r\\n\\r\\n' | "
        f"nc -w 3 {PEER} {PEER_PORT} > /dev/null || exit 1; i=$((i+1)); done")


def record(sb_id: str, backend: str) -> SandboxRecord:
    now = time.time()
    return SandboxRecord(id=sb_id, spec=SandboxSpec(backend=backend, memory_mb=256),
                         state="creating", created_at=now, last_active_at=now)


async def run(connector, script: str) -> tuple[int, float]:
    t0 = time.perf_counter()
    proc = await AgentProcess.start(connector, SpawnRequest(
        argv=["sh", "-c", script], env={"PATH": "/usr/bin:/bin"}))
    proc.close_stdin()
    while (await proc.next_event())[0] != "exit":
        pass
    return proc.exit_code, time.perf_counter() - t0


async def measure(backend, rec: SandboxRecord, net: NetworkManager, rounds: int) -> dict:
    """Grant, fetch (per fetch), refuse: one sandbox's figures."""
    t0 = time.perf_counter()
    await net.set(rec, {"peer": True}, [rec])
    grant = time.perf_counter() - t0
    connector = backend.connector(rec)
    fetch = []
    for _ in range(rounds):
        code, took = await run(connector, LOOP)
        if code != 0:
            raise RuntimeError(f"{rec.spec.backend}: fetching from the peer failed ({code})")
        fetch.append(took / FETCHES)
    refused = []
    for _ in range(rounds):
        code, took = await run(connector, f"echo x | nc -w 3 {PEER} 22")
        if code == 0:
            raise RuntimeError(f"{rec.spec.backend}: an ungranted port was reachable")
        refused.append(took)
    dropped, _ = await net.status(rec)
    return {"grant": grant, "fetch": statistics.median(fetch),
            "refused": statistics.median(refused), "dropped": dropped}


async def in_sandbox(backend, net: NetworkManager, rounds: int) -> dict:
    """:func:`measure` in a new sandbox of ``backend``, stopped afterwards."""
    rec = record(f"sb-bench-gnet-{backend.name}", backend.name)
    rec.runtime = await backend.start(rec)
    try:
        return await measure(backend, rec, net, rounds)
    finally:
        await backend.stop(rec)


def host_fetch(rounds: int) -> float:
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        subprocess.run(["busybox", "sh", "-c", LOOP.replace("nc ", "busybox nc ")], check=True)
        out.append((time.perf_counter() - t0) / FETCHES)
    return statistics.median(out)


def ms(s: float) -> str:
    return f"{s * 1000:.2f} ms" if s < 0.01 else f"{s * 1000:.1f} ms"


async def main(args: argparse.Namespace) -> None:
    state = Path(tempfile.mkdtemp(prefix="dsec-bench-gnet-"))
    (state / "network.json").write_text(json.dumps(
        {"subnet": SUBNET, "permissions": {"peer": {"addresses": [f"{PEER}/32"],
                                                    "ports": [PEER_PORT]}}}))
    images = ImageService(state)
    net = NetworkManager(state, secrets.token_hex(4))
    try:
        images.ensure_busybox()
        peer = Peer().start()  # the tests' peer: a netns with an HTTP server on PEER:PORT
        try:
            host = host_fetch(args.rounds)
            ctr = await in_sandbox(ContainerBackend(state, images, ensure_agent(state / "bin")),
                                   net, args.rounds)
            vb = MicroVMBackend(state, images, config=MicroVMConfig(
                guest_dir=ROOT / "build" / "guest"))
            accel = await vb.accel()
            vm = await in_sandbox(vb, net, args.rounds)
        finally:
            peer.stop()
        await net.close()
    finally:
        images.unmount_all()
        shutil.rmtree(state, ignore_errors=True)
    print(f"microvm accelerator: {accel.upper()}; medians of {args.rounds} rounds "
          f"({FETCHES} fetches each)\n")
    print("| figure | runc container | microvm guest | host (baseline) |")
    print("|---|---|---|---|")
    print(f"| grant `peer` to a running sandbox (veth + nftables) | {ms(ctr['grant'])} | "
          f"{ms(vm['grant'])} | n/a |")
    print(f"| fetch from the granted peer, per fetch (starts `nc` each time) | "
          f"{ms(ctr['fetch'])} | {ms(vm['fetch'])} | {ms(host)} |")
    print(f"| connect to an ungranted port: refused after | {ms(ctr['refused'])} | "
          f"{ms(vm['refused'])} | n/a |")
    print(f"| packets counted as refused | {ctr['dropped']} | {vm['dropped']} | n/a |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="exec rounds per figure")
    asyncio.run(main(ap.parse_args()))
