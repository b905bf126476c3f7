"""The microvm backend with real QEMU guests (TCG here: each boot costs seconds, so one
guest is shared by the tests of this module that do not end it)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
import pytest_asyncio

from dsec.api.errors import Internal, SandboxTimeout
from dsec.api.models import ExecRequest, SandboxSpec
from dsec.images import ImageService
from dsec.images.whiteout import is_opaque, is_whiteout
from dsec.node.agent.client import AgentProcess, SpawnRequest, ping
from dsec.node.backends.base import Backend, SandboxRecord
from dsec.node.backends.microvm import MicroVMBackend, MicroVMConfig
from dsec.node.backends.microvm.accel import detect_accel
from dsec.node.backends.microvm import serialmux
from dsec.node.backends.microvm.guest import ensure_guest
from dsec.node.backends.microvm.qemu import LaunchSpec, qemu_argv, read_pid
from dsec.node.execution import run_exec
from dsec.node.host import cgroups, netns

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(300)]

GUEST_DIR = Path(__file__).resolve().parents[3] / "build" / "guest"


def record(sb_id: str, **spec) -> SandboxRecord:
    now = time.time()
    return SandboxRecord(id=sb_id, spec=SandboxSpec(backend="microvm", **spec),
                         state="creating", created_at=now, last_active_at=now)


async def run(backend, rec, script: str, stdin: bytes = b"") -> tuple[int, bytes, bytes]:
    proc = await AgentProcess.start(backend.connector(rec), SpawnRequest(
        argv=["sh", "-c", script], env={"PATH": "/usr/bin:/bin:/usr/sbin:/sbin"}))
    if stdin:
        proc.write_stdin(stdin)
    proc.close_stdin()
    out, err = b"", b""
    while True:
        kind, data = await proc.next_event()
        if kind == "exit":
            return proc.exit_code, out, err
        if kind == "stdout":
            out += data
        else:
            err += data


def qemu_pids_under(root: Path) -> list[int]:
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if str(root).encode() in (p / "cmdline").read_bytes():
                    pids.append(int(p.name))
            except OSError:
                pass
    return pids


@pytest.fixture(scope="module")
def state(tmp_path_factory):
    root = tmp_path_factory.mktemp("microvm")
    images = ImageService(root)
    images.ensure_busybox()
    yield root, images
    images.unmount_all()
    assert not qemu_pids_under(root), "QEMU processes left behind"
    left = list((root / "sandboxes").iterdir()) if (root / "sandboxes").exists() else []
    left += [f"cgroup {h} {s}" for s in ("sb-mvshared", "sb-mvclone0", "sb-mvclone1",
                                         "sb-mvpanic", "sb-mvsilent")
             for h in cgroups.detect().leftovers(f"/dsec/{s}")]
    shutil.rmtree(root)
    assert not left, f"sandbox files left behind: {left}"


def make_backend(state, **cfg) -> MicroVMBackend:
    root, images = state
    return MicroVMBackend(root, images, config=MicroVMConfig(guest_dir=GUEST_DIR, **cfg))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def guest(state):
    backend = make_backend(state, console_log_bytes=16384)
    rec = record("sb-mvshared", memory_mb=192, cpu=0.5)
    rec.runtime = await backend.start(rec)
    yield backend, rec
    await backend.stop(rec)


async def test_backend_satisfies_protocol(state):
    assert isinstance(make_backend(state), Backend)


async def test_exec_runs_in_the_guest_kernel(guest):
    backend, rec = guest
    code, out, err = await run(backend, rec, "uname -r; hostname; echo oops >&2; exit 3")
    kernel, hostname = out.decode().split()
    assert code == 3 and err == b"oops\n"
    assert kernel != os.uname().release and hostname == "sb-mvshared"
    assert await backend.alive(rec)


async def test_node_exec_path_works_unchanged(guest):
    backend, rec = guest
    ok = await run_exec(backend, rec, ExecRequest(cmd="echo $HOME; pwd", cwd="/tmp"))
    home = rec.runtime["image_env"]["HOME"]
    assert (ok.exit_code, ok.stdout) == (0, f"{home}\n/tmp\n")
    slow = await run_exec(backend, rec, ExecRequest(cmd="sleep 30", timeout=1))
    assert slow.timed_out and slow.duration_ms < 10_000


async def test_a_restarted_node_finds_the_guest_again(guest, state):
    backend, rec = guest
    fresh = make_backend(state)  # what a node builds after its own restart
    assert await fresh.alive(rec)
    code, out, _ = await run(fresh, rec, "echo still here")
    assert (code, out) == (0, b"still here\n")


async def test_memory_limit_is_the_guest_ram(guest):
    backend, rec = guest
    _, out, _ = await run(backend, rec, "grep MemTotal /proc/meminfo")
    assert int(out.split()[1]) <= 192 * 1024
    assert 0 < backend.memory_bytes(rec) < 400 << 20


async def test_qemu_runs_in_the_sandbox_cgroup_with_its_cpu_quota(guest):
    backend, rec = guest
    pid = read_pid(backend.sandbox_dir(rec.id))
    driver = cgroups.detect()
    assert pid in driver.procs(f"/dsec/{rec.id}")
    if driver.version == 2:
        quota = (cgroups.ROOT / "dsec" / rec.id / "cpu.max").read_text().split()[0]
    else:
        quota = (cgroups.ROOT / "cpu" / "dsec" / rec.id / "cpu.cfs_quota_us").read_text()
    assert int(quota) == 50_000


async def test_guest_cannot_reach_the_host_network(guest):
    backend, rec = guest
    hits = []
    server = await asyncio.start_server(lambda r, w: (hits.append(1), w.close()),
                                        "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        # 10.0.2.2 is the host's loopback as QEMU user networking shows it, unless restricted.
        code, _, _ = await run(backend, rec, f"echo hi | nc -w 3 10.0.2.2 {port}")
    finally:
        server.close()
    assert code != 0 and hits == []


async def test_files_roundtrip(guest):
    backend, rec = guest
    files = backend.files(rec)
    await asyncio.to_thread(files.mkdir, "/data/sub")
    with files.open_write("/data/sub/a.txt", 0o600) as f:
        f.write(b"payload " * 1000)
    assert files.open_read("/data/sub/a.txt").read() == b"payload " * 1000
    info = files.stat("/data/sub/a.txt")
    assert (info.type, info.size, info.mode) == ("file", 8000, 0o600)
    assert [e.name for e in files.list("/data")] == ["sub"]
    tar = tarfile.open(fileobj=io.BytesIO(b"".join(files.tar_out("/data/sub"))))
    assert tar.getnames() == ["sub", "sub/a.txt"]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        data = b"from tar"
        ti = tarfile.TarInfo("b.txt")
        ti.size = len(data)
        t.addfile(ti, io.BytesIO(data))
    buf.seek(0)
    files.tar_in("/data/up", buf, 1 << 20)
    assert files.open_read("/data/up/b.txt").read() == b"from tar"
    files.remove("/data", recursive=True)
    with pytest.raises(Exception, match="no such file"):
        files.stat("/data")


async def test_pack_diff_keeps_files_whiteouts_and_opaque_dirs(guest, state):
    backend, rec = guest
    _, images = state
    code, _, err = await run(backend, rec, "echo new > /added && rm /bin/rev && "
                                           "rm -rf /usr/sbin && mkdir /usr/sbin && "
                                           "echo z > /usr/sbin/only && echo t > /tmp/scratch")
    assert code == 0, err
    info = await backend.pack_diff(rec, "packed:v1", exclude=["/tmp"])
    top = images.resolve("packed:v1").lowerdirs[0]
    assert (top / "added").read_text() == "new\n"
    assert is_whiteout(os.lstat(top / "bin" / "rev"))
    assert is_opaque(top / "usr" / "sbin") and (top / "usr" / "sbin" / "only").exists()
    assert not (top / "tmp" / "scratch").exists() and not (top / ".dsec").exists()
    assert info.tag == "packed:v1"


async def test_pause_stops_the_guest_and_resume_continues(guest):
    backend, rec = guest
    await run(backend, rec, "sleep 1000 >/dev/null 2>&1 & echo $! > /tmp/sleeper")
    await backend.pause(rec)
    assert not await ping(backend.connector(rec), timeout=1.0)
    await backend.resume(rec)
    code, _, _ = await run(backend, rec, "kill -0 $(cat /tmp/sleeper)")
    assert code == 0


async def test_pause_to_disk_ends_qemu_and_restore_keeps_processes(guest):
    backend, rec = guest
    d = backend.sandbox_dir(rec.id)
    await run(backend, rec, "echo kept > /tmp/kept; sleep 1000 >/dev/null 2>&1 & "
                            "echo $! > /tmp/sleeper2")
    backend.config.pause_to_disk = True
    try:
        await backend.pause(rec)
        assert read_pid(d) is None and (d / "saved.mig").exists()
        assert await backend.alive(rec)
        await backend.resume(rec)
        # The restored QEMU is back in the namespace the node plumbed (it outlived QEMU).
        assert netns.inode(f"/proc/{read_pid(d)}/ns/net") == netns.inode(d / "netns")
    finally:
        backend.config.pause_to_disk = False
    code, out, _ = await run(backend, rec, "cat /tmp/kept; kill -0 $(cat /tmp/sleeper2)")
    assert (code, out) == (0, b"kept\n")
    assert not (d / "saved.mig").exists()


async def test_console_flood_stays_capped(guest):
    backend, rec = guest
    await run(backend, rec, "head -c 300000 /dev/zero | tr '\\0' x > /dev/ttyS0")
    assert backend.oom_kills(rec) == 0  # drains the console
    assert (backend.sandbox_dir(rec.id) / "console.log").stat().st_size <= 16384 + 64


async def test_guest_oom_kill_is_counted(guest):
    backend, rec = guest
    before = backend.oom_kills(rec)
    # Two 120 MB buffers in a 192 MB guest: each allocation passes, touching both cannot.
    await run(backend, rec, "for i in 1 2; do dd if=/dev/zero of=/dev/null bs=120M count=1 & "
                            "done; wait")
    assert backend.oom_kills(rec) > before
    assert await backend.alive(rec)


async def test_qemu_command_line_confines_the_guest(tmp_path):
    spec = LaunchSpec(kernel=tmp_path / "k", initrd=tmp_path / "i", layers=[tmp_path / "l0"],
                      scratch=tmp_path / "rw.img", workdir=tmp_path)
    argv = " ".join(qemu_argv(spec))
    assert "user,id=n0,restrict=on " in argv + " "  # host namespace: no egress at all
    assert "hostfwd" not in argv  # the agent is on a virtio-serial port, not the network
    assert f"socket,id=agent,path={tmp_path / 'agent.sock'},server=on" in argv
    assert "virtserialport,chardev=agent,name=dsec.agent" in argv
    # In its own namespace, the namespace decides (loopback only until plumbed).
    own = " ".join(qemu_argv(spec.model_copy(update={"netns": tmp_path / "netns"})))
    assert "user,id=n0,restrict=off " in own + " "
    assert "ringbuf" in argv and "file:" not in argv  # console in bounded memory, no file
    assert f"file={tmp_path / 'l0'},format=raw,readonly=on" in argv
    assert "-sandbox on" in argv and "shutdown=pause" in argv


async def test_accel_probe_answer_is_remembered(tmp_path):
    art = ensure_guest(GUEST_DIR)
    # A QEMU that cannot boot anything: the probe must fall back to TCG and write it down.
    assert await detect_accel(tmp_path, "/bin/false", art) == "tcg"
    cache = tmp_path / "accel.json"
    saved = json.loads(cache.read_text())
    cache.write_text(json.dumps({**saved, "accel": "kvm"}))
    assert await detect_accel(tmp_path, "/bin/false", art) == "kvm"  # no second probe


async def test_the_guest_runs_in_its_own_network_namespace(guest):
    backend, rec = guest
    d = backend.sandbox_dir(rec.id)
    own = netns.inode(rec.runtime["netns"])
    assert own == netns.inode(f"/proc/{read_pid(d)}/ns/net") != netns.inode("/proc/self/ns/net")
    listening = subprocess.run([*netns.nsenter_argv(Path(rec.runtime["netns"])), "ip", "-o",
                                "link"], capture_output=True, text=True).stdout
    assert [ln.split(":")[1].strip() for ln in listening.splitlines()] == ["lo"]


async def test_panicking_guest_fails_fast_and_leaves_nothing(state):
    backend = make_backend(state, kernel_args="rdinit=/nonexistent")
    rec = record("sb-mvpanic", memory_mb=128)
    t0 = time.monotonic()
    with pytest.raises(Internal, match="failed to boot"):
        await backend.start(rec)
    assert time.monotonic() - t0 < 60
    assert not backend.sandbox_dir(rec.id).exists()


async def test_silent_guest_times_out(state):
    backend = make_backend(state, boot_timeout_s=1.0)
    rec = record("sb-mvsilent", memory_mb=128)
    with pytest.raises(SandboxTimeout, match="did not answer"):
        await backend.start(rec)
    assert not backend.sandbox_dir(rec.id).exists()


async def test_clones_start_from_a_template_with_their_own_identity(state):
    backend = make_backend(state, warm_start=True)
    recs = [record(f"sb-mvclone{i}", memory_mb=128) for i in range(2)]
    try:
        for r in recs:
            r.runtime = await backend.start(r)
        await run(backend, recs[0], "echo mine > /only-here")
        code0, out0, _ = await run(backend, recs[0], "hostname; cat /only-here")
        code1, out1, _ = await run(backend, recs[1], "hostname; cat /only-here")
        assert out0 == b"sb-mvclone0\nmine\n"
        assert out1.startswith(b"sb-mvclone1\n") and code1 != 0
        spaces = {netns.inode(f"/proc/{read_pid(backend.sandbox_dir(r.id))}/ns/net")
                  for r in recs}
        assert spaces == {netns.inode(r.runtime["netns"]) for r in recs} and len(spaces) == 2
    finally:
        for r in recs:
            await backend.stop(r)
        await backend.drop_templates()


# ---- the agent's virtio-serial port, multiplexed (serialmux) ----
async def test_many_commands_share_the_port_at_once(guest):
    backend, rec = guest
    results = await asyncio.gather(*(run(backend, rec, f"sleep 0.5; echo {i}")
                                     for i in range(20)))
    assert [r[1] for r in results] == [f"{i}\n".encode() for i in range(20)]


async def test_bytes_cross_the_port_intact_both_ways(guest):
    backend, rec = guest
    data = os.urandom(3 << 20)
    code, out, _ = await run(backend, rec, "cat", stdin=data)
    assert code == 0 and out == data


async def test_a_reader_that_stops_stalls_only_its_own_channel(guest):
    backend, rec = guest
    flood = await AgentProcess.start(backend.connector(rec), SpawnRequest(
        argv=["sh", "-c", "yes flood"], env={"PATH": "/bin"}))
    try:
        await asyncio.sleep(1.0)  # its window fills and nobody reads it
        code, out, _ = await asyncio.wait_for(run(backend, rec, "echo other"), 30)
        assert (code, out) == (0, b"other\n")
    finally:
        flood.close()
    await asyncio.sleep(0.5)
    _, out, _ = await run(backend, rec, "pgrep -x yes || echo none")
    assert out == b"none\n"  # closing the channel ended the command in the guest


async def test_a_new_node_takes_the_port_over_mid_command(guest):
    backend, rec = guest
    d = backend.sandbox_dir(rec.id)
    busy = asyncio.create_task(run(backend, rec, "sleep 30"))
    await asyncio.sleep(0.5)
    serialmux.drop(d / "agent.sock")  # what a node that died leaves: a closed port
    with pytest.raises(Exception):
        await asyncio.wait_for(busy, 10)
    code, out, _ = await run(backend, rec, "echo again")
    assert (code, out) == (0, b"again\n")


async def test_guest_processes_cannot_reach_the_agent(guest):
    backend, rec = guest
    # The agent holds its port open (a port has one opener) and listens on no network.
    code, out, err = await run(backend, rec,
                               "for p in /sys/class/virtio-ports/*; do "
                               "[ $(cat $p/name) = dsec.agent ] && dev=/dev/${p##*/}; done; "
                               "echo $dev; head -c1 $dev; echo rc=$?; netstat -ltn | grep -c LISTEN")
    lines = out.decode().split()
    assert lines[0].startswith("/dev/vport") and "rc=1" in lines and lines[-1] == "0", (out, err)
    assert b"busy" in err.lower()
