"""microvm guests through a real server started with --guest-pause-to-disk and
--guest-warm-start: a paused guest is saved to disk (its QEMU ends), comes back on the next
request with its files, processes and egress; a SIGKILLed server finds its guests again
(reattaching to their agent ports); clones start from a template. TCG on this machine."""

import asyncio
import json
import os
import tempfile
from pathlib import Path

import pytest

import dsec
from tests.redteam.conftest import peer  # noqa: F401 (fixture)
from tests.redteam.netpeer import HTTP_GET, PEER, PEER_PORT
from tests.support.server import ServerProcess, leftovers

pytestmark = pytest.mark.timeout(600)
SUBNET = "10.218.0.0/24"  # apart from the other test nodes' sandbox subnets


def qemu_of(state_dir: Path, sb_id: str) -> list[int]:
    """Pids of QEMU processes started for this sandbox."""
    needle = str(state_dir / "sandboxes" / sb_id).encode()
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if b"qemu" in (p / "comm").read_bytes() and needle in (p / "cmdline").read_bytes():
                    pids.append(int(p.name))
            except OSError:
                pass
    return pids


def lingering(pid: int, server_pid: int) -> list[str]:
    """What is left of QEMU ``pid`` (a zombie counts) and of any QEMU child of the server."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                comm, rest = (p / "stat").read_text().rsplit(")", 1)
            except OSError:
                continue
            state, ppid = rest.split()[:2]
            if int(p.name) == pid or ("qemu" in comm and int(ppid) == server_pid):
                out.append(f"pid {p.name}{comm}) state {state} parent {ppid}")
    return out


@pytest.fixture(scope="module")
def guest_server():
    d = Path(tempfile.mkdtemp(prefix="dsec-guests-"))
    (d / "network.json").write_text(json.dumps({"subnet": SUBNET, "permissions": {
        "peer": {"addresses": [f"{PEER}/32"], "ports": [PEER_PORT]}}}))
    srv = ServerProcess(state_dir=d, backends=["microvm"],
                        extra_args=["--guest-pause-to-disk", "--guest-warm-start"]).start()
    yield srv
    srv.stop_all_sandboxes()
    left = leftovers(srv.state_dir)
    srv.destroy()
    assert not left, left


async def test_pause_saves_the_guest_and_ends_qemu_then_the_next_request_restores_it(
        peer, guest_server):
    srv = guest_server
    async with dsec.AsyncClient(srv.url, srv.token, timeout=300) as c:
        sb = await c.create(backend="microvm", network={"peer": True}, memory_mb=256)
        try:
            await sb.files.write("/root/notes", b"kept")
            await sb.exec("sleep 999", background=True)
            assert qemu_of(srv.state_dir, sb.id)
            await sb.pause()
            assert (await sb.refresh()).state == "paused"
            assert qemu_of(srv.state_dir, sb.id) == []  # all of its memory is back
            assert (srv.state_dir / "sandboxes" / sb.id / "saved.mig").exists()
            r = await sb.exec("cat /root/notes; ps -o args | grep -c '^sleep 999'")
            assert r.stdout == "kept1\n"
            assert (await sb.exec(HTTP_GET, timeout=30)).stdout.startswith("HTTP/1.0 200")
        finally:
            await sb.stop()
        assert qemu_of(srv.state_dir, sb.id) == []


async def test_stop_and_pause_to_disk_return_once_qemu_is_reaped(guest_server):
    srv = guest_server
    async with dsec.AsyncClient(srv.url, srv.token, timeout=300) as c:
        sb = await c.create(backend="microvm", memory_mb=256)
        try:
            [pid] = qemu_of(srv.state_dir, sb.id)
            await sb.pause()  # to disk: its QEMU ends
            assert lingering(pid, srv.proc.pid) == []
            await sb.exec("true")  # restored in a new QEMU
            [pid] = qemu_of(srv.state_dir, sb.id)
        finally:
            await sb.stop()
        # Before: a daemonized QEMU was init's child, a zombie for a second or two after.
        assert lingering(pid, srv.proc.pid) == []


async def test_a_best_effort_guest_saved_to_disk_comes_back_best_effort(guest_server):
    """Its QEMU is restored into the cgroup it left, already idle (v1 refused cpu.shares
    on it: the restore failed with EINVAL), and every thread of the new QEMU is SCHED_IDLE."""
    srv = guest_server
    async with dsec.AsyncClient(srv.url, srv.token, timeout=300) as c:
        sb = await c.create(backend="microvm", memory_mb=256, cpu_class="best_effort")
        try:
            await sb.pause()
            assert (await sb.exec("echo back")).stdout == "back\n"
            [pid] = qemu_of(srv.state_dir, sb.id)
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
            assert len(tids) > 1 and {os.sched_getscheduler(t) for t in tids} == {os.SCHED_IDLE}
        finally:
            await sb.stop()


async def test_clones_of_one_template_are_separate_guests(guest_server):
    srv = guest_server
    async with dsec.AsyncClient(srv.url, srv.token, timeout=300) as c:
        a, b = await c.create_many(2, backend="microvm", memory_mb=256)
        try:
            assert (await a.exec("hostname")).stdout.strip() == a.id
            assert (await b.exec("hostname")).stdout.strip() == b.id
            await a.files.write("/only-a", b"1")
            assert (await b.exec("cat /only-a")).exit_code != 0
        finally:
            await asyncio.gather(a.stop(), b.stop())


async def test_a_killed_server_finds_its_guests_again(peer, guest_server):
    srv = guest_server
    async with dsec.AsyncClient(srv.url, srv.token, timeout=300) as c:
        sb = await c.create(backend="microvm", network={"peer": True}, memory_mb=256)
        await sb.files.write("/root/state", b"precious")
        busy = asyncio.create_task(sb.exec("sleep 20; echo late", timeout=60))
        await asyncio.sleep(1.0)
        srv.kill()  # mid-command: the guest keeps running, its agent port is left open
        srv.proc = None
        with pytest.raises(dsec.DSecError):
            await busy
    srv.start()
    async with dsec.AsyncClient(srv.url, srv.token, timeout=300) as c:
        again = await c.get(sb.id)
        assert (await again.refresh()).state == "running"
        assert await again.files.read("/root/state") == b"precious"
        assert (await again.exec("echo back")).stdout == "back\n"
        assert (await again.exec(HTTP_GET, timeout=30)).stdout.startswith("HTTP/1.0 200")
        await again.stop()
