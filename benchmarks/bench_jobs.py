"""Pause, then resume, a job of 200 sandboxes: time, and memory freed.

The trainer is preempted: `client.jobs.pause(job)` freezes every sandbox of the job; later
each sandbox resumes transparently on its next request (or all at once with
`jobs.resume`). Each sandbox holds a process with ~4 MiB of its own memory. Measured:
the time to pause the job, the job's charged memory and the host's available memory
before and after, the first exec on a paused sandbox against one on a running sandbox, and
the time to resume the whole job. Baseline in the same run: stopping the job's sandboxes
and creating 200 new ones (what a platform without pause does; the state is lost).
"""

from __future__ import annotations

import asyncio
import statistics
import time

import common

import dsec

SPEC = {"memory_mb": 64, "cpu": 0.25}
HOLD = "x=$(head -c 4000000 /dev/zero | tr '\\0' a); sleep 100000; echo ${#x}"


async def main(quick: bool) -> None:
    n = 20 if quick else 200
    notes: list[str] = []
    with common.server() as srv:
        async with dsec.AsyncClient(srv.url, srv.token, timeout=600) as c:
            job = "job-bench"
            t0 = time.perf_counter()
            sbs = await c.create_many(n, job=job, **SPEC)
            t_create = time.perf_counter() - t0
            assert len(sbs) == n, f"only {len(sbs)} of {n} created"
            await asyncio.gather(*(sb.exec(["/bin/sh", "-c", HOLD], background=True)
                                   for sb in sbs))
            await asyncio.sleep(3)  # let the holders fill their memory
            running_exec = [await _timed_exec(sb) for sb in sbs[:20]]
            before = await c.jobs.get(job)
            avail_before = common.mem_available()

            t0 = time.perf_counter()
            paused = await c.jobs.pause(job)
            t_pause = time.perf_counter() - t0
            assert paused.states == {"paused": n}, paused.states
            await asyncio.sleep(1)
            during = await c.jobs.get(job)
            avail_during = common.mem_available()

            paused_exec = [await _timed_exec(sb) for sb in sbs[:20]]  # transparent resume
            t0 = time.perf_counter()
            resumed = await c.jobs.resume(job)
            t_resume = time.perf_counter() - t0
            assert resumed.states == {"running": n}, resumed.states

            t0 = time.perf_counter()
            await c.jobs.stop(job)
            t_stop = time.perf_counter() - t0
            t0 = time.perf_counter()
            again = await c.create_many(n, job=job, **SPEC)
            t_recreate = time.perf_counter() - t0
            await c.jobs.stop(job)
    rows = [
        ["pause the job (jobs.pause)", f"{t_pause:.2f} s", f"{t_pause / n * 1000:.1f} ms"],
        ["resume the job (jobs.resume)", f"{t_resume:.2f} s", f"{t_resume / n * 1000:.1f} ms"],
        ["first exec on a paused sandbox (p50)", "",
         common.fmt_ms(statistics.median(paused_exec)) + " ms"],
        ["exec on a running sandbox (p50)", "",
         common.fmt_ms(statistics.median(running_exec)) + " ms"],
        ["baseline: stop the job", f"{t_stop:.2f} s", f"{t_stop / n * 1000:.1f} ms"],
        [f"baseline: create_many({n}) again", f"{t_recreate:.2f} s",
         f"{t_recreate / n * 1000:.1f} ms"],
    ]
    mem = common.table(
        ["", "job memory charged (MiB)", "host MemAvailable (MiB)"],
        [["running", f"{before.memory_used_mb:.0f}", f"{avail_before / (1 << 20):.0f}"],
         ["paused", f"{during.memory_used_mb:.0f}", f"{avail_during / (1 << 20):.0f}"],
         ["freed by pausing", f"{before.memory_used_mb - during.memory_used_mb:.0f}",
          f"{(avail_during - avail_before) / (1 << 20):.0f}"]])
    notes.append(f"{n} sandboxes of {SPEC['memory_mb']} MiB, each holding ~4 MiB in a "
                 f"shell variable; created with create_many in {t_create:.1f} s "
                 f"({len(again)} again for the baseline)")
    notes.append("pausing freezes the processes (cgroup freezer) and keeps every file and "
                 "page: it frees CPU, not memory; reclaiming a paused sandbox's memory is "
                 "the density work's")
    if srv.left:
        notes.append(f"LEFT: {srv.left}")
    body = common.table(["operation", "total", "per sandbox"], rows) + "\n\n" + mem
    common.publish("jobs-quick" if quick else "jobs",
                   f"Pause and resume of a job of {n} sandboxes", body, notes)
    if srv.left:
        raise SystemExit(1)


async def _timed_exec(sb) -> float:
    t0 = time.perf_counter()
    r = await sb.exec(["true"])
    assert r.exit_code == 0, r
    return time.perf_counter() - t0


if __name__ == "__main__":
    args = common.parse_args(__doc__)
    asyncio.run(main(args.quick))
