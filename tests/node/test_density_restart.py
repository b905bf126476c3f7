"""SIGKILL a real server while its sandboxes are paused and swapped out; the restarted node
finds them paused and resumes them whole: every byte, every process, limits as running."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import dsec
from dsec.node.host.cgroups import detect
from tests.node.test_density import FILE, HOLD
from tests.node.test_density_faults import limits_as_running
from tests.support.server import ServerProcess, leftovers

MiB = 1 << 20


@pytest.fixture
def own_server():
    srv = ServerProcess().start()
    yield srv
    srv.destroy()


async def holding(sb) -> str:
    md5 = (await sb.exec(FILE)).stdout.strip()
    await sb.exec(HOLD, background=True)
    await sb.exec("while [ ! -f /tmp/held ]; do sleep 0.1; done")
    return md5


async def swapped_out(sb) -> dsec.SandboxInfo:
    for _ in range(600):
        info = await sb.refresh()
        if info.reclaim and not info.reclaim.startswith("reclaiming"):
            return info
        await asyncio.sleep(0.1)
    raise AssertionError(f"reclaim of {sb.id} did not end: {info.reclaim}")


def holders(sb_id: str) -> list[int]:
    """The sandbox's shells running HOLD (its ``sleep`` children come and go)."""
    out = []
    for pid in detect().procs(f"/dsec/{sb_id}"):
        try:
            if b"/tmp/held" in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.append(pid)
        except OSError:
            pass
    # a fork of it about to exec its next `sleep` has its command line too: not the holder
    out = [p for p in out if _ppid(p) not in out]
    assert out, f"no process of {sb_id} holds the memory"
    return sorted(out)


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    except (OSError, ValueError):
        return 0


def cut_short(sb_id: str) -> None:
    """What a node killed in the middle of a v1 reclaim step leaves: the limit lowered to
    what the cgroup holds, and swap closed to its own reclaim."""
    drv = detect()
    mem = drv.root / "memory" / "dsec" / sb_id
    (mem / "memory.limit_in_bytes").write_text(
        str(drv.memory_bytes(f"/dsec/{sb_id}") + MiB))
    (mem / "memory.swappiness").write_text("0")


async def test_a_node_killed_while_sandboxes_are_swapped_out_resumes_them_intact(own_server):
    srv, drv = own_server, detect()
    async with dsec.AsyncClient(srv.url, srv.token) as c:
        sbs = await c.create_many(2, memory_mb=256, disk_mb=128, job="swapped")
        md5s = [await holding(sb) for sb in sbs]
        pids = [holders(sb.id) for sb in sbs]
        await c.jobs.pause("swapped")
        for sb in sbs:
            info = await swapped_out(sb)
            assert info.state == "paused" and info.memory_swapped_mb > 30, info
    srv.kill()
    srv.proc = None
    if drv.version == 1:
        cut_short(sbs[1].id)
    srv.start()
    async with dsec.AsyncClient(srv.url, srv.token) as c:
        listed = {i.id: i for i in await c.list(job="swapped")}
        assert {i: s.state for i, s in listed.items()} == {s.id: "paused" for s in sbs}
        assert all(i.memory_swapped_mb > 30 for i in listed.values()), listed
        for sb, md5, before in zip(sbs, md5s, pids):
            again = await c.get(sb.id)
            assert (await again.exec("md5sum /root/blob")).stdout.strip() == md5  # resumes
            out = await again.exec("touch /tmp/ask; while [ ! -f /tmp/len ]; do sleep 0.1; "
                                   "done; cat /tmp/len")
            assert out.stdout.strip() == "40000000"
            assert holders(sb.id) == before  # the very process that held the memory
            info = await again.refresh()
            assert info.state == "running" and info.reclaim is None, info
            limits_as_running(sb.id, 256 * MiB)
            if drv.version == 1:
                swappiness = drv.root / "memory" / "dsec" / sb.id / "memory.swappiness"
                assert swappiness.read_text().strip() == \
                    Path("/proc/sys/vm/swappiness").read_text().strip()
        for sb in sbs:
            await (await c.get(sb.id)).stop()
    assert leftovers(srv.state_dir) == []
