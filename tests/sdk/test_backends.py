"""One acceptance test, three backends: switching `backend=` is the only change a user makes.

microvm and vm guests run under QEMU with TCG on this machine (nested KVM does not boot)."""

import asyncio
import os
from pathlib import Path

import pytest

import dsec
from tests.support.server import ServerProcess, leftovers

BACKENDS = ["container", "microvm", "vm"]


@pytest.fixture(scope="module")
def multi_server():
    srv = ServerProcess(backends=BACKENDS).start()
    yield srv
    srv.stop_all_sandboxes()
    left = leftovers(srv.state_dir)
    srv.destroy()
    assert not left, left


@pytest.mark.parametrize("backend", BACKENDS)
async def test_the_same_verbs_on_every_backend(multi_server, backend):
    async with dsec.AsyncClient(multi_server.url, multi_server.token, timeout=300) as c:
        sb = await c.create(backend=backend, image="busybox", memory_mb=256)
        try:
            info = await sb.refresh()
            assert info.backend == backend
            # Host memory it holds now: a cgroup's usage, or a guest's QEMU (Pss).
            assert 0 < info.memory_used_mb < 4 * 256, info.memory_used_mb
            r = await sb.exec("echo hi; echo err >&2; exit 3", timeout=30)
            assert (r.exit_code, r.stdout, r.stderr) == (3, "hi\n", "err\n")
            assert (await sb.exec(["no-such-command"])).exit_code == 127
            events = [e async for e in sb.exec_stream("echo a; echo b >&2")]
            assert events[-1].type == "exit" and events[-1].result.exit_code == 0
            sh = await sb.shell()
            await sh.run("mkdir -p /w && cd /w && export X=7")
            assert (await sh.run("pwd; echo $X")).stdout == "/w\n7\n"
            await sb.files.write("/w/f.txt", b"payload")
            assert await sb.files.read("/w/f.txt") == b"payload"
            assert "f.txt" in [e.name for e in await sb.files.list("/w")]
            assert (await sb.exec("cat /w/f.txt")).stdout == "payload"
            await sb.pause()
            assert (await sb.exec("echo back")).stdout == "back\n"  # resumes on use
            r = await sb.exec("sleep 60", timeout=2)
            assert r.timed_out
            if backend != "vm":
                with pytest.raises(dsec.Unsupported):
                    await sb.screenshot()
        finally:
            await sb.stop()
        with pytest.raises(dsec.NotFound):
            await c.get(sb.id)


async def test_vm_has_a_display_and_input(multi_server):
    async with dsec.AsyncClient(multi_server.url, multi_server.token, timeout=300) as c:
        sb = await c.create(backend="vm", image="busybox", memory_mb=256)
        try:
            png = await sb.screenshot()
            assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000
            await sb.input.click(10, 10)
            await sb.input.keys("shift")
            with pytest.raises(dsec.Unsupported):
                await sb.pack_diff("vm/nope:1")
        finally:
            await sb.stop()


async def test_guests_are_separate_from_each_other(multi_server):
    async with dsec.AsyncClient(multi_server.url, multi_server.token, timeout=300) as c:
        a, b = await asyncio.gather(c.create(backend="microvm", memory_mb=256),
                                    c.create(backend="microvm", memory_mb=256))
        try:
            await a.files.write("/tmp/only-a", b"1")
            assert (await b.exec("ls /tmp/only-a")).exit_code != 0
            ka = (await a.exec("cat /proc/sys/kernel/random/boot_id")).stdout
            kb = (await b.exec("cat /proc/sys/kernel/random/boot_id")).stdout
            assert ka != kb, "each guest has its own kernel"
        finally:
            await asyncio.gather(a.stop(), b.stop())


def _policies(sb_id: str) -> set[int]:
    """Scheduling policies of every thread in the sandbox's cgroup (a guest: its QEMU)."""
    from dsec.node.host.cgroups import detect
    out = set()
    for pid in detect().procs(f"/dsec/{sb_id}"):
        for tid in os.listdir(f"/proc/{pid}/task"):
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            out.add(int(stat.rpartition(")")[2].split()[38]))
    return out


@pytest.mark.parametrize("backend", BACKENDS)
async def test_best_effort_on_every_backend(multi_server, backend):
    """cpu_class="best_effort" is the same one argument everywhere: the sandbox's cgroup
    is idle class and every thread in it (a guest's QEMU, vCPUs included) SCHED_IDLE."""
    from dsec.node.host.cgroups import detect
    async with dsec.AsyncClient(multi_server.url, multi_server.token, timeout=300) as c:
        sb = await c.create(backend=backend, memory_mb=256, cpu_class="best_effort")
        try:
            assert (await sb.refresh()).cpu_class == "best_effort"
            assert (await sb.exec("echo hi")).stdout == "hi\n"
            assert detect().cpu_idle(f"/dsec/{sb.id}")
            assert _policies(sb.id) == {os.SCHED_IDLE}
        finally:
            await sb.stop()
