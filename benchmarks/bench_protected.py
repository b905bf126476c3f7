"""Exec round trip with and without protected paths (Landlock), issue 10.

One server, two busybox sandboxes side by side: one plain, one created with
``protected_paths=["/grader", "/repo/tests/hidden.sh"]``, so every command of the second is
started under a Landlock ruleset the agent builds for it (it lists the entries of ``/``,
``/repo`` and ``/repo/tests`` and adds a rule per entry). Calls alternate between the two in
interleaved rounds, so load from other users of the machine falls on both alike. Also the
node→agent round trip alone (no HTTP), where the agent's share shows undiluted. A third
path is the grading step in the protected sandbox (``grading=True``), whose commands get a
ruleset handling only Landlock's REFER right (no hard links out of protected paths): its
baseline is the plain sandbox, which is what a grading command cost before. Last, the
create-time hard-link check of an image (a walk of its protected paths) against the
remembered answer every later create of that image gets.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import sys
import time

import common

import dsec
from dsec.node.agent.client import AgentProcess, SpawnRequest, unix_connector

PROTECTED = ["/grader", "/repo/tests/hidden.sh"]


async def agent_round(sock: str, protect: list[str], nolink: list[str]) -> None:
    spawn = SpawnRequest(argv=["true"], env={"PATH": "/bin"}, protect=protect, nolink=nolink)
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
            for label, sb, protect, nolink in (("plain", plain, [], []),
                                               ("protected", guarded, PROTECTED, []),
                                               ("grading", guarded, [], PROTECTED)):
                sock = str(srv.state_dir / "sandboxes" / sb.id / "agent.sock")

                async def sdk(sb=sb, grading=bool(nolink)):
                    r = await sb.exec(["true"], grading=grading)
                    assert r.exit_code == 0, r

                async def agent(sock=sock, protect=protect, nolink=nolink):
                    await agent_round(sock, protect, nolink)

                paths[f"SDK exec, {label}"] = sdk
                paths[f"node→agent, {label}"] = agent
            assert (await guarded.exec("cat /grader/s")).exit_code != 0  # really confined
            r = await guarded.exec("ln /grader/s /tmp/s", grading=True)
            assert "cross-device" in r.stderr, r  # the grading step really gets its ruleset
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


def image_check(srv, n: int) -> tuple[float, float]:
    """Median seconds of the create-time hard-link check of busybox: walked (a new
    ImageLinks each time) and remembered."""
    from dsec.images import ImageService
    from dsec.node.host.imagelinks import ImageLinks
    resolved = ImageService(srv.state_dir).resolve("busybox")

    def root():
        return contextlib.nullcontext(str(resolved.lowerdirs[0]))
    walked, known, links = [], [], ImageLinks()
    for _ in range(n):
        t0 = time.perf_counter()
        ImageLinks().check(resolved.layer_digests, PROTECTED + ["/etc"], root)
        walked.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        links.check(resolved.layer_digests, PROTECTED + ["/etc"], root)
        known.append(time.perf_counter() - t0)
    return statistics.median(walked), statistics.median(known[1:])


def main(quick: bool) -> None:
    rounds, per_round, warmup = (3, 10, 5) if quick else (10, 50, 50)
    with common.server() as srv:
        samples = asyncio.run(measure(srv, rounds, per_round, warmup))
        walked, known = image_check(srv, 20 if quick else 200)
    rows = []
    for what in ("SDK exec", "node→agent"):
        b = common.summary(samples[f"{what}, plain"])
        for label in ("protected", "grading"):
            a = common.summary(samples[f"{what}, {label}"])
            rows.append([f"{what} `[\"true\"]`, {label}", b["n"], common.fmt_ms(b["p50"]),
                         common.fmt_ms(a["p50"]), f"{(a['p50'] - b['p50']) * 1000:+.3f}",
                         common.ratio(a["p50"], b["p50"]), common.fmt_ms(b["p90"]),
                         common.fmt_ms(a["p90"])])
    body = common.table(["path", "n each", "p50 plain ms", "p50 this ms", "Δ p50 ms",
                         "this / plain", "p90 plain ms", "p90 this ms"], rows)
    body += ("\n\n" + common.table(
        ["create-time hard-link check of busybox", "median ms"],
        [["walked (first create of an image)", f"{walked * 1000:.3f}"],
         ["remembered (every later create, pooled ones too)", f"{known * 1000:.4f}"]]))
    notes = [f"Protected: `protected_paths={PROTECTED}`: each command gets a Landlock ruleset "
             "built by the agent before fork (one rule per entry of /, /repo, /repo/tests).",
             "Grading: `grading=True` in that sandbox: a ruleset handling only REFER, one "
             "rule per directory entry of /, /repo, /repo/tests (files get none); plain is "
             "what it cost before it had one.",
             f"Hard-link check: protected paths {PROTECTED + ['/etc']} (/etc: a directory "
             "to walk) in the busybox layer; walked = a fresh ImageLinks each time.",
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
