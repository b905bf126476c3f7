"""Exec round trip before and after the control-channel and seccomp hardening (issue 13).

Two real servers run side by side in the same run: one from this tree, one from the commit
before the hardening (checked out into a temporary git worktree, so its agent, its tini
init and its seccomp blocklist are the old ones). Each gets one busybox sandbox; calls go
to both in interleaved rounds, so load from other users of the machine falls on both alike.
Budget (issue 13): the hardening may cost at most 0.2 ms at p50.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import common
from bench_exec import agent_true

import dsec

REPO = Path(__file__).resolve().parents[1]
BEFORE = "c0066a9"  # main before issue 13's hardening


@contextmanager
def old_tree(rev: str):
    """A detached worktree of ``rev``; removed on exit."""
    path = Path(tempfile.mkdtemp(prefix="dsec-before-"))
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(path), rev],
                   check=True)
    try:
        yield path
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(path)],
                       check=False)


@contextmanager
def server_from(src: Path | None):
    """``common.server()`` running the code under ``src`` (this tree when None)."""
    saved = os.environ.get("PYTHONPATH")
    if src is not None:
        os.environ["PYTHONPATH"] = str(src)
    try:
        with common.server() as srv:
            if saved is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = saved
            yield srv
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


async def measure(servers: dict[str, object], rounds: int, per_round: int, warmup: int
                  ) -> dict[str, list[float]]:
    clients, paths = [], {}
    try:
        for label, srv in servers.items():
            c = dsec.AsyncClient(srv.url, srv.token)
            clients.append(c)
            sb = await c.create(memory_mb=256)
            sock = str(srv.state_dir / "sandboxes" / sb.id / "agent.sock")

            async def sdk(sb=sb):
                r = await sb.exec(["true"])
                assert r.exit_code == 0, r

            async def agent(sock=sock):
                await agent_true(sock)

            paths[f"SDK exec `[\"true\"]`, {label}"] = sdk
            paths[f"node→agent only, {label}"] = agent
        for fn in paths.values():
            for _ in range(warmup):
                await fn()
        samples: dict[str, list[float]] = {k: [] for k in paths}
        for _ in range(rounds):
            for name, fn in paths.items():
                for _ in range(per_round):
                    t0 = time.perf_counter()
                    await fn()
                    samples[name].append(time.perf_counter() - t0)
        return samples
    finally:
        for c in clients:
            for info in await c.list():
                await (await c.get(info.id)).stop()
            await c.close()


def main(quick: bool, rev: str) -> None:
    rounds, per_round, warmup = (3, 10, 5) if quick else (10, 50, 50)
    with old_tree(rev) as tree, server_from(tree / "src") as old, server_from(None) as new:
        samples = asyncio.run(measure({"before": old, "after": new}, rounds, per_round, warmup))
    left = old.left + new.left
    rows = []
    for what in ("SDK exec `[\"true\"]`", "node→agent only"):
        b = common.summary(samples[f"{what}, before"])
        a = common.summary(samples[f"{what}, after"])
        rows.append([what, b["n"], common.fmt_ms(b["p50"]), common.fmt_ms(a["p50"]),
                     f"{(a['p50'] - b['p50']) * 1000:+.3f}", common.ratio(a["p50"], b["p50"]),
                     common.fmt_ms(b["p90"]), common.fmt_ms(a["p90"])])
    delta = (common.percentile(samples["SDK exec `[\"true\"]`, after"], 50)
             - common.percentile(samples["SDK exec `[\"true\"]`, before"], 50))
    verdict = "met" if delta <= 0.0002 else "NOT met"
    body = common.table(["path", "n each", "p50 before ms", "p50 after ms", "Δ p50 ms",
                         "after / before", "p90 before ms", "p90 after ms"], rows)
    notes = [f"Budget: the hardening costs ≤ 0.2 ms at p50 — {verdict} "
             f"(SDK Δ {delta * 1000:+.3f} ms).",
             f"Before: commit {rev} (tini as init, a forked relay per connection, the seccomp "
             "blocklist). After: this tree (the agent is the init, a thread per connection, "
             "not dumpable; Docker's allowlist from containers-common, hardened).",
             f"Sequential calls, {rounds} interleaved rounds of {per_round}; one busybox "
             "sandbox (256 MiB) per server.",
             "Cleanup after stop: " + ("nothing left" if not left else ", ".join(left))]
    name = "hardening-quick" if quick else "hardening"
    common.publish(name, "Exec round trip before and after the hardening"
                   + (" (quick)" if quick else ""), body, notes)
    if left:
        raise SystemExit(f"leftovers: {left}")


if __name__ == "__main__":
    args = common.parse_args(__doc__, lambda p: p.add_argument(
        "--before", default=BEFORE, help=f"git revision to compare with (default {BEFORE})"))
    main(args.quick, args.before)
    sys.exit(0)
