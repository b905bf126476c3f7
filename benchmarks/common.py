"""Shared helpers for the benchmark scripts: a server, percentiles, the machine, the tables.

Every script runs standalone (``.venv/bin/python benchmarks/bench_x.py [--quick]``), starts
its own server on a free loopback port with a temporary state directory, prints a markdown
table and writes it to ``benchmarks/results/<name>.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
if str(ROOT) not in sys.path:  # for tests.support.server when run as a plain script
    sys.path.insert(0, str(ROOT))

from tests.support.server import ServerProcess, leftovers  # noqa: E402

__all__ = ["ServerProcess", "server", "parse_args", "percentile", "summary", "fmt_ms",
           "ratio", "table", "machine", "load", "drop_caches", "mem_available", "meminfo",
           "leftover_report", "publish", "timed", "step_times", "sh", "mounts_under"]


# ---- arguments ----
def parse_args(doc: str, extra: Callable[[argparse.ArgumentParser], None] | None = None
               ) -> argparse.Namespace:
    """``--quick`` and whatever ``extra`` adds to the parser."""
    p = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a few iterations only (CI-sized)")
    if extra:
        extra(p)
    return p.parse_args()


# ---- the server ----
@contextmanager
def server(extra_args: list[str] | None = None):
    """A real dsec server in a subprocess (``extra_args`` go to ``dsec.gateway.server``).

    On exit every sandbox is stopped and the server ends (draining any warm pool); then
    what the sandboxes left behind is recorded in ``srv.left`` (empty when clean) before
    the layers are unmounted and the state directory is removed."""
    srv = ServerProcess(extra_args=extra_args)
    srv.left = []
    try:
        srv.start()
        yield srv
    finally:
        names: list[str] = []
        try:
            if srv.proc and srv.proc.poll() is None:
                srv.stop_all_sandboxes()
            sb_dir = srv.state_dir / "sandboxes"
            names = [p.name for p in sb_dir.iterdir()] if sb_dir.is_dir() else []
        finally:
            srv.stop()
            srv.left = leftover_report(srv, names)
            srv.destroy()
            if srv.state_dir.exists() or mounts_under(srv.state_dir):
                srv.left.append(f"state dir {srv.state_dir} not removed")


def mounts_under(path: Path) -> list[str]:
    return [ln.split(" ")[4] for ln in Path("/proc/self/mountinfo").read_text().splitlines()
            if ln.split(" ")[4].startswith(str(path))]


# ---- statistics ----
def percentile(xs: Iterable[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation; NaN for no samples."""
    s = sorted(xs)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summary(xs: list[float]) -> dict[str, float]:
    return {"n": len(xs), "p50": percentile(xs, 50), "p90": percentile(xs, 90),
            "mean": statistics.fmean(xs) if xs else float("nan"),
            "min": min(xs) if xs else float("nan")}


def fmt_ms(seconds: float) -> str:
    ms = seconds * 1000
    return f"{ms:.2f}" if ms < 10 else f"{ms:.1f}"


def ratio(a: float, b: float) -> str:
    """``a / b`` formatted as ``0.42×``; '—' when either is missing."""
    if not a or not b or a != a or b != b:
        return "—"
    return f"{a / b:.2f}×"


def table(headers: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


async def step_times(node, sb_id: str, cmd: str, n: int, timeout: float) -> list[float]:
    """Milliseconds of each of ``n`` runs, one after another, of ``sh -c cmd`` in sandbox
    ``sb_id`` through ``node``'s exec (a NodeService); each must exit 0."""
    from dsec.api.models import ExecRequest
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = await node.exec(sb_id, ExecRequest(cmd=["sh", "-c", cmd], timeout=timeout))
        assert r.exit_code == 0, r.stderr
        out.append((time.perf_counter() - t0) * 1000)
    return out


def sh(*args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), check=check, capture_output=True, text=True, **kw)


# ---- the machine ----
def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def meminfo(key: str) -> int:
    """A /proc/meminfo field in bytes."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def mem_available() -> int:
    return meminfo("MemAvailable")


def cgroup_mode() -> str:
    root = Path("/sys/fs/cgroup")
    if (root / "cgroup.controllers").exists():
        return "v2 (unified)"
    if (root / "unified").is_dir():
        return "v1 (hybrid)"
    return "v1"


def load() -> str:
    """The load averages (1, 5, 15 min): other engineers share these cores."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def machine() -> str:
    runc = sh("runc", "--version", check=False).stdout.splitlines()
    return (f"{_cpu_model()}, {os.cpu_count()} cores, "
            f"{meminfo('MemTotal') / (1 << 30):.1f} GiB, kernel {platform.release()}, "
            f"cgroup {cgroup_mode()}, Python {platform.python_version()}, "
            f"{runc[0] if runc else 'runc ?'}")


def drop_caches() -> None:
    """Flush dirty pages and drop the page cache, dentries and inodes (root only)."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError as exc:
        print(f"warning: could not drop caches: {exc}", file=sys.stderr)


# ---- cleanup checks ----
def leftover_report(srv: ServerProcess, ids: Iterable[str] = ()) -> list[str]:
    """What sandboxes left behind: runc containers, mounts, sandbox dirs, cgroup dirs.

    ``ids`` are sandbox ids whose cgroup directories (dsec/<id>) must be gone."""
    found = leftovers(srv.state_dir)
    out = sh("runc", "--root", str(srv.state_dir / "runc"), "list", "--format", "json",
             check=False).stdout.strip()
    for c in json.loads(out or "null") or []:
        found.append(f"runc-list {c['id']}")
    cg = Path("/sys/fs/cgroup")
    for sb_id in ids:
        for d in [cg / c / "dsec" / sb_id for c in ("memory", "pids", "cpu", "freezer")] \
                + [cg / "dsec" / sb_id]:
            if d.is_dir():
                found.append(f"cgroup {d}")
    return sorted(set(found))


# ---- output ----
def publish(name: str, title: str, body: str, notes: list[str] | None = None) -> str:
    """Print the result and write it to ``benchmarks/results/<name>.md``."""
    parts = [f"## {title}", "",
             f"Machine: {machine()}.  ",
             f"Run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
             f"load average at the end {load()} (shared machine).", "", body]
    if notes:
        parts += [""] + [f"- {n}" for n in notes]
    text = "\n".join(parts) + "\n"
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.md").write_text(text)
    return text
