"""Server memory under large payloads, before and after issue 13's resource bounds.

Two real servers side by side in one run: one from this tree, one from the commit before
(a temporary git worktree). Each call's cost is the growth of the server process's peak
RSS over it (``VmHWM`` after, minus ``VmRSS`` before, with the peak reset through
``/proc/<pid>/clear_refs``), beside the payload size as the baseline. Cases: an exec that
prints N MB with ``max_output`` at its 1 GiB ceiling, the same as a stream, a 1 GiB upload
into a ``disk_mb=16`` sandbox, and a files write (where its pages are charged: the sandbox's
``memory_used_mb`` before and after). A second table prices the write helper: small writes
and a 1000-file tar upload.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import common
from bench_hardening import old_tree, server_from

import dsec

BEFORE = "c0066a9"  # main before issue 13
MiB = 1 << 20


def _status(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) << 10
    raise LookupError(field)


async def peak_growth(pid: int, call) -> tuple[int, object]:
    """(peak RSS growth in bytes, what ``call()`` returned or raised)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    before = _status(pid, "VmRSS")
    try:
        out: object = await call()
    except dsec.DSecError as exc:
        out = exc
    return _status(pid, "VmHWM") - before, out


def _outcome(out: object) -> str:
    if isinstance(out, dsec.DSecError):
        return f"{type(out).__name__}: {out.message[:60]}"
    if isinstance(out, dsec.ExecResult):
        return f"kept {len(out.stdout) / MiB:.1f} MiB, truncated={out.stdout_truncated}"
    if isinstance(out, int):
        return f"streamed {out / MiB:.0f} MiB"
    return type(out).__name__


async def exec_case(srv, n: int, stream: bool) -> list[object]:
    async with dsec.AsyncClient(srv.url, srv.token) as c:
        sb = await c.create(memory_mb=256)
        await sb.exec("head -c 100000 /dev/zero")  # warm the code path, not the heap
        cmd = f"head -c {n} /dev/zero | tr '\\0' a"

        async def streamed() -> int:
            seen = 0
            async for ev in sb.exec_stream(cmd, max_output=1 << 30, timeout=300):
                seen += len(ev.data) if ev.type == "stdout" else 0
            return seen
        call = streamed if stream else (lambda: sb.exec(cmd, max_output=1 << 30, timeout=300))
        g, out = await peak_growth(srv.proc.pid, call)
        await sb.stop()
    return [f"{'exec_stream' if stream else 'exec'}, {n // 10**6} MB of output", n, g,
            _outcome(out)]


async def upload_case(srv, big: Path) -> list[object]:
    async with dsec.AsyncClient(srv.url, srv.token) as c:
        sb = await c.create(memory_mb=256, disk_mb=16)
        await sb.files.write("/warm", b"x")
        g, out = await peak_growth(srv.proc.pid, lambda: sb.files.upload(big, "/big"))
        alive = (await sb.exec("echo ok")).stdout == "ok\n"
        await sb.stop()
    return ["upload 1 GiB into disk_mb=16", 1 << 30, g,
            _outcome(out) + ("; sandbox fine after" if alive else "; sandbox broken")]


async def write_case(srv) -> list[object]:
    async with dsec.AsyncClient(srv.url, srv.token) as c:
        sb = await c.create(memory_mb=128)
        await sb.files.write("/warm", b"x")
        used0 = (await sb.refresh()).memory_used_mb
        g, _ = await peak_growth(srv.proc.pid, lambda: sb.files.write("/w", b"x" * (48 * MiB)))
        used1 = (await sb.refresh()).memory_used_mb
        await sb.stop()
    return ["files write 48 MiB (memory_mb=128)", 48 * MiB, g,
            f"sandbox memory_used_mb {used0} → {used1}"]


async def cost_rows(srv, tree: Path) -> dict[str, float]:
    async with dsec.AsyncClient(srv.url, srv.token) as c:
        sb = await c.create(memory_mb=512)
        for i in range(5):
            await sb.files.write(f"/warm{i}", b"x")
        t0 = time.perf_counter()
        for i in range(200):
            await sb.files.write(f"/w{i}", b"x" * 100)
        small = (time.perf_counter() - t0) / 200
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            await sb.files.upload_dir(tree, "/up")
            best = min(best, time.perf_counter() - t0)
        await sb.stop()
    return {"files.write 100 B, mean ms": small * 1000, "upload_dir 1000 × 2 KB, best s": best}


def main(quick: bool, rev: str) -> None:
    sizes = [10 * 10**6, 50 * 10**6] if quick else [10 * 10**6, 50 * 10**6, 200 * 10**6]
    scratch = Path(tempfile.mkdtemp(prefix="dsec-bench-mem-"))
    tree = scratch / "tree"
    tree.mkdir()
    for i in range(1000):
        (tree / f"f{i}").write_bytes(os.urandom(2000))
    big = scratch / "sparse-1g"
    with open(big, "wb") as f:
        f.truncate(1 << 30)  # sparse: the client reads zeros without a disk
    cases = [lambda srv, n=n: exec_case(srv, n, False) for n in sizes]
    cases += [lambda srv: exec_case(srv, sizes[-1], True), lambda srv: upload_case(srv, big),
              write_case]
    results: dict[str, list] = {"before": [], "after": []}
    costs: dict[str, dict] = {}
    with old_tree(rev) as old_src:
        for label, src in (("before", old_src / "src"), ("after", None)):
            for case in cases:  # a fresh server per case: no heap left over from the last
                with server_from(src) as srv:
                    results[label].append(asyncio.run(case(srv)))
                if srv.left:
                    raise SystemExit(f"leftovers ({label}): {srv.left}")
            with server_from(src) as srv:
                costs[label] = asyncio.run(cost_rows(srv, tree))
    shutil.rmtree(scratch)
    rows = []
    for b, a in zip(results["before"], results["after"]):
        rows.append([b[0], f"{b[1] / MiB:.0f}", f"{b[2] / MiB:.0f}", f"{a[2] / MiB:.0f}",
                     f"{b[2] / b[1]:.2f}×", f"{a[2] / a[1]:.2f}×", b[3], a[3]])
    body = common.table(["call", "payload MiB (baseline)", "peak RSS growth before MiB",
                         "after MiB", "before / payload", "after / payload",
                         "outcome before", "outcome after"], rows)
    body += "\n\n" + common.table(
        ["files path", "before", "after", "after / before"],
        [[k, f"{costs['before'][k]:.2f}", f"{costs['after'][k]:.2f}",
          common.ratio(costs["after"][k], costs["before"][k])] for k in costs["after"]])
    notes = [f"Before: commit {rev}. After: this tree (NodeConfig.max_exec_output 8 MiB per "
             "stream, results kept in one bytearray and serialised straight to bytes, streams "
             "unbuffered, files written by a helper in the sandbox's memory cgroup).",
             "Peak RSS growth of the server process over one call, on a fresh server per "
             "case (one small warm-up call first); after, an exec's growth is mostly the "
             "trajectory log's copies of the 8 MiB it kept.",
             "Files path: 200 sequential 100-byte writes; upload_dir best of 3."]
    name = "exec_memory-quick" if quick else "exec_memory"
    common.publish(name, "Server memory under large payloads, before and after"
                   + (" (quick)" if quick else ""), body, notes)


if __name__ == "__main__":
    args = common.parse_args(__doc__, lambda p: p.add_argument(
        "--before", default=BEFORE, help=f"git revision to compare with (default {BEFORE})"))
    main(args.quick, args.before)
    sys.exit(0)
