"""Exec round trip with and without protected paths (Landlock), issue 10.

One server, two busybox sandboxes side by side: one plain, one created with
``protected_paths=["/grader", "/repo/tests/hidden.sh"]``, so every command of the second is
started under a Landlock ruleset the agent builds for it (it lists the entries of ``/``,
``/repo`` and ``/repo/tests`` and adds a rule per entry). Calls alternate between the two in
interleaved rounds, so load from other users of the machine falls on both alike. Also the
node→agent round trip alone (no HTTP), where the agent's share shows undiluted.
"""

from __future__ import annotations

import asyncio
import sys
import time

import common

import dsec
from dsec.node.agent.client import AgentProcess, SpawnRequest, unix_connector

PROTECTED = ["/grader", "/repo/tests/hidden.sh"]


async def agent_round(sock: str, protect: list[str]) -> None:
    spawn = SpawnRequest(argv=["true"], env={"PATH": "/bin"}, protect=protect)
    proc = await AgentProcess.start(unix_connector(sock), spawn, no_stdin=True)
    while (await proc.next_event())[0] != "exit":
        pass
    if proc.exit_code != 0:
        raise RuntimeError(f"agent: true exited {proc.exit_code}")


async def measure(srv, rounds: int, per_round: int, warmup: int) -> dict[str, list[float]]:
    async with dsec.AsyncClient(srv.url, srv.token) as c:
        plain = await c.create(memory_mb=256)
        guarded = await c.create(memory_mb=256, protected_paths=PROTECTED)
        try:
            await guarded.exec("mkdir -p /grader /repo/tests && echo x > /grader/s", grading=True)
            paths = {}
            for label, sb, protect in (("plain", plain, []), ("protected", guarded, PROTECTED)):
                sock = str(srv.state_dir / "sandboxes" / sb.id / "agent.sock")

                async def sdk(sb=sb):
                    r = await sb.exec(["true"])
                    assert r.exit_code == 0, r

                async def agent(sock=sock, protect=protect):
                    await agent_round(sock, protect)

                paths[f"SDK exec, {label}"] = sdk
                paths[f"node→agent, {label}"] = agent
            assert (await guarded.exec("cat /grader/s")).exit_code != 0  # really confined
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
            await plain.stop()
            await guarded.stop()


def main(quick: bool) -> None:
    rounds, per_round, warmup = (3, 10, 5) if quick else (10, 50, 50)
    with common.server() as srv:
        samples = asyncio.run(measure(srv, rounds, per_round, warmup))
    rows = []
    for what in ("SDK exec", "node→agent"):
        b = common.summary(samples[f"{what}, plain"])
        a = common.summary(samples[f"{what}, protected"])
        rows.append([f"{what} `[\"true\"]`", b["n"], common.fmt_ms(b["p50"]),
                     common.fmt_ms(a["p50"]), f"{(a['p50'] - b['p50']) * 1000:+.3f}",
                     common.ratio(a["p50"], b["p50"]), common.fmt_ms(b["p90"]),
                     common.fmt_ms(a["p90"])])
    body = common.table(["path", "n each", "p50 plain ms", "p50 protected ms", "Δ p50 ms",
                         "protected / plain", "p90 plain ms", "p90 protected ms"], rows)
    notes = [f"Protected: `protected_paths={PROTECTED}`: each command gets a Landlock ruleset "
             "built by the agent before fork (one rule per entry of /, /repo, /repo/tests).",
             f"Sequential calls, {rounds} interleaved rounds of {per_round} per path; two busybox "
             "sandboxes (256 MiB) on one server.",
             "Cleanup after stop: " + ("nothing left" if not srv.left else ", ".join(srv.left))]
    name = "protected-quick" if quick else "protected"
    common.publish(name, "Exec round trip with protected paths (Landlock)"
                   + (" (quick)" if quick else ""), body, notes)
    if srv.left:
        raise SystemExit(f"leftovers: {srv.left}")


if __name__ == "__main__":
    args = common.parse_args(__doc__)
    main(args.quick)
    sys.exit(0)
