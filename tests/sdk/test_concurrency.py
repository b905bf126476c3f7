"""Many execs in flight over many sandboxes from one client: every result right and whole."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import dsec

SANDBOXES = 16
IN_FLIGHT = 64
EXECS = 256
SCRIPT = 'echo "out-$0"; printf "%${2}s" "" | tr " " x; echo "err-$0" >&2; exit "$1"'


async def _one(sb: dsec.AsyncSandbox, i: int) -> None:
    """Exec number ``i``: its own exit code, stdout of its own length, stderr."""
    if i % 4 == 0:  # through stdin, the path with a stdin feeder
        r = await sb.exec(["cat"], stdin=f"in-{i}\n" * 100)
        assert (r.exit_code, r.stdout, r.stderr) == (0, f"in-{i}\n" * 100, ""), (i, r)
        return
    width = i * 37 % 5000
    r = await sb.exec(["/bin/sh", "-c", SCRIPT, str(i), str(i % 7), str(width)])
    assert (r.exit_code, r.stdout, r.stderr) == (i % 7, f"out-{i}\n" + "x" * width,
                                                 f"err-{i}\n"), (i, r.exit_code, r.stderr)
    assert not r.stdout_truncated and not r.timed_out and not r.oom_killed


async def test_many_execs_in_flight_over_many_sandboxes_all_answer_right(client):
    sbs = await client.create_many(SANDBOXES, memory_mb=64, cpu=0.25)
    assert len(sbs) == SANDBOXES
    try:
        gate = asyncio.Semaphore(IN_FLIGHT)
        sent: dict[str, int] = defaultdict(int)

        async def run(i: int) -> None:
            sb = sbs[i % SANDBOXES]
            sent[sb.id] += 1
            async with gate:
                await _one(sb, i)

        await asyncio.gather(*(run(i) for i in range(EXECS)))
        # Every exec is in its sandbox's trajectory log, numbered without a gap.
        for sb in sbs:
            page = await sb.trajectory()
            assert [e.seq for e in page.entries] == list(range(sent[sb.id])), sb.id
            assert all(e.kind == "exec" for e in page.entries)
    finally:
        await asyncio.gather(*(sb.stop() for sb in sbs), return_exceptions=True)
