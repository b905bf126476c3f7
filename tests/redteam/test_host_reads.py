"""Reading the whole filesystem from a sandbox is bounded by the sandbox's own limits.

``grep -r /`` inside a container meets endless files (``/dev/zero``) and blocking ones
(``/dev/tty``, fifos): it cannot be relied on to end by itself. What must hold is that it
ends at the sandbox's limits (memory, then the exec timeout), the node keeps serving
others meanwhile, and the sandbox itself survives.
"""

import asyncio


async def test_grep_r_root_is_bounded_and_harms_nobody(client):
    sb = await client.create(memory_mb=64, cpu=0.5)
    other = await client.create(memory_mb=64)
    try:
        grep = asyncio.create_task(sb.exec("grep -r never-there-zq /", timeout=20))
        assert (await other.exec("echo alive")).stdout == "alive\n"  # node still serves
        r = await grep
        assert r.exit_code != 0 and (r.timed_out or r.oom_killed or r.exit_code == 1), r
        assert (await sb.exec("echo still usable")).stdout == "still usable\n"
        assert (await other.exec("echo alive")).stdout == "alive\n"
    finally:
        await sb.stop()
        await other.stop()


async def test_an_endless_file_is_stopped_by_the_memory_limit(client):
    sb = await client.create(memory_mb=64)
    try:
        r = await sb.exec("grep -r never-there-zq /dev/zero", timeout=120)
        assert r.oom_killed and not r.timed_out, r
        assert (await sb.exec("echo still usable")).stdout == "still usable\n"
    finally:
        await sb.stop()


async def test_a_huge_output_is_capped_not_buffered(sandbox):
    r = await sandbox.exec("cat /dev/zero | head -c 200000000", max_output=1 << 16, timeout=120)
    assert len(r.stdout) <= 1 << 16 and r.stdout_truncated
