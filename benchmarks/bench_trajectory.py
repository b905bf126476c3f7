"""Fast-forward of a 200-step trajectory on reconnect, beside re-running it live.

A trainer runs 200 keyed steps in a sandbox, is "preempted" (its client closes), and a new
client attaches and re-issues the same 200 steps. dsec answers them from the trajectory
log. The baseline, measured in the same run, is running the 200 steps again live in a
fresh sandbox (what a trainer without the log would have to do, if its steps were even
safe to repeat), and the HTTP floor (200 `sb.refresh()` round trips). Two workloads: a
cheap step (`echo`) and a 100 ms step (`sleep 0.1`), standing in for real tool calls.
"""

from __future__ import annotations

import asyncio
import time

import common

import dsec

WORKLOADS = {"echo": "echo {i} >> /tmp/log",
             "sleep 0.1": "sleep 0.1; echo {i} >> /tmp/log"}
SPEC = {"memory_mb": 128}


async def run_steps(sb, cmd: str, n: int, prefix: str) -> tuple[float, list[float]]:
    per = []
    t0 = time.perf_counter()
    for i in range(n):
        t = time.perf_counter()
        r = await sb.exec(cmd.format(i=i), step=f"{prefix}/t{i}")
        per.append(time.perf_counter() - t)
        assert r.exit_code == 0, r
    return time.perf_counter() - t0, per


async def one_round(srv, cmd: str, n: int, prefix: str, paused: bool) -> dict:
    async with dsec.AsyncClient(srv.url, srv.token) as first:
        sb = await first.create(**SPEC)
        live, _ = await run_steps(sb, cmd, n, prefix)
        if paused:
            await sb.pause()
    async with dsec.AsyncClient(srv.url, srv.token) as again:  # the restarted trainer
        t0 = time.perf_counter()
        sb2 = await again.attach(sb.id)
        ff, per = await run_steps(sb2, cmd, n, prefix)
        ff_total = time.perf_counter() - t0
        lines = (await sb2.files.read("/tmp/log")).decode().count("\n")
        assert lines == n, f"steps ran twice: {lines} lines for {n} steps"
        t0 = time.perf_counter()
        for _ in range(n):
            await sb2.refresh()
        floor = time.perf_counter() - t0
        await sb2.stop()
    return {"live": live, "ff": ff_total, "ff_per": per, "floor": floor}


async def main(quick: bool) -> None:
    n, rounds = (20, 2) if quick else (200, 3)
    rows, notes = [], []
    with common.server() as srv:
        async with dsec.AsyncClient(srv.url, srv.token) as c:  # warm-up
            await (await c.create(**SPEC)).stop()
        for name, cmd in WORKLOADS.items():
            for paused in (False, True):
                res = [await one_round(srv, cmd, n, f"r{k}{paused}", paused)
                       for k in range(rounds)]
                live = common.percentile([r["live"] for r in res], 50)
                ff = common.percentile([r["ff"] for r in res], 50)
                floor = common.percentile([r["floor"] for r in res], 50)
                per = common.percentile([x for r in res for x in r["ff_per"]], 50)
                label = f"{name}{' (sandbox paused)' if paused else ''}"
                rows.append([label, n, f"{live:.2f}", f"{ff:.3f}", f"{floor:.3f}",
                             common.fmt_ms(per), f"{live / ff:.0f}×"])
    if srv.left:
        notes.append(f"LEFT: {srv.left}")
    notes.append(f"median of {rounds} rounds; each round is a new sandbox, {n} keyed steps, "
                 "then a new client attaches and re-issues them all; every step is checked "
                 "to have run exactly once")
    notes.append("the paused rows fast-forward a paused sandbox: answered from the log "
                 "without resuming it")
    body = common.table(["workload", "steps", "live run (s)", "fast-forward (s)",
                         "HTTP floor (s)", "ff per step p50 (ms)", "live / ff"], rows)
    common.publish("trajectory-quick" if quick else "trajectory",
                   f"Fast-forward of a {n}-step trajectory vs running it", body, notes)
    if srv.left:
        raise SystemExit(1)


if __name__ == "__main__":
    args = common.parse_args(__doc__)
    asyncio.run(main(args.quick))
