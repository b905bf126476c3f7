"""A container sandbox's mounts on real runc: few superblocks (each costs kernel memory per
memory cgroup, so per sandbox in proportion to the sandboxes: issue 12), with the masked
paths still hidden and /dev/shm still a working, limited, non-executable shared memory."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dsec.api.models import ExecRequest, PackDiffRequest, SandboxSpec
from dsec.node.backends.config import ContainerBackendConfig
from dsec.node.config import NodeConfig
from dsec.node.host import mounts
from dsec.node.service import NodeService
from tests.support.density import sandbox_superblocks

# host: rw tmpfs + overlay root; sandbox: proc, /dev tmpfs, devpts, mqueue, sysfs
MAX_SUPERBLOCKS = 7


@pytest.fixture
async def node(tmp_path):
    svc = await NodeService.open(NodeConfig(state_dir=tmp_path, backends=["container"]))
    yield svc
    await svc.close(stop_sandboxes=True)


async def run(node, sb_id: str, cmd: str):
    return await node.exec(sb_id, ExecRequest(cmd=["sh", "-c", cmd], timeout=60))


async def test_a_sandbox_adds_at_most_seven_superblocks(node):
    info = await node.create(SandboxSpec(memory_mb=32))
    own = sandbox_superblocks(node, info.id)
    assert len(own) <= MAX_SUPERBLOCKS, own


async def test_masked_paths_stay_hidden_and_read_only(node):
    info = await node.create(SandboxSpec(memory_mb=32))
    r = await run(node, info.id, "ls -A /sys/firmware /sys/kernel/debug /proc/acpi 2>/dev/null;"
                  " wc -c < /proc/kpagecgroup")
    assert r.stdout.split() == [f for f in r.stdout.split() if f.endswith(":")] + ["0"]
    for d in ("/sys/firmware", "/sys/kernel/debug"):
        r = await run(node, info.id, f"touch {d}/x || mkdir {d}/y")
        assert r.exit_code != 0, d


async def test_dev_shm_is_shared_memory_limited_by_the_disk(node):
    info = await node.create(SandboxSpec(memory_mb=64, disk_mb=8))
    r = await run(node, info.id, "stat -c %a /dev/shm; echo hi > /dev/shm/f && cat /dev/shm/f")
    assert r.stdout.split() == ["1777", "hi"], r.stderr
    r = await run(node, info.id, "cp /bin/busybox /dev/shm/bb && /dev/shm/bb true")
    assert r.exit_code != 0, "/dev/shm must be noexec"
    r = await run(node, info.id, "dd if=/dev/zero of=/dev/shm/big bs=1M count=16")
    assert r.exit_code != 0, "/dev/shm must be limited (by disk_mb)"
    upper = Path(node.record(info.id).runtime["dir"]) / "rw" / "upper"
    assert not list(upper.rglob("f")), "shm must stay out of the layer pack_diff packs"


# ---- runc's own mount namespace (issue 12: create time against the host's mount table) ----

EXTRA = 5


@pytest.fixture(params=[False, True], ids=["own-namespace", "sees-host"])
async def spied(request, tmp_path):
    """A node whose runc is a wrapper that counts, in the namespace it runs in, the mounts
    of other sandboxes (EXTRA tmpfs mounts under <state>/sandboxes/extra), then runs runc."""
    state, seen = tmp_path / "state", tmp_path / "seen"
    spy = tmp_path / "runc-spy"
    spy.write_text("#!/bin/sh\n"
                   f"case \" $* \" in *\" run \"*) grep -c ' {state}/sandboxes/extra/' "
                   f"/proc/self/mountinfo >> {seen};; esac\n"
                   f"exec {shutil.which('runc')} \"$@\"\n")
    spy.chmod(0o755)
    node = await NodeService.open(NodeConfig(
        state_dir=state, backends=["container"],
        container=ContainerBackendConfig(runc=str(spy), runc_sees_host=request.param)))
    extra = state / "sandboxes" / "extra"
    for i in range(EXTRA):
        (extra / str(i)).mkdir(parents=True)
        mounts.mount("tmpfs", extra / str(i), "tmpfs", 0, "size=1m")
    try:
        yield node, seen, request.param
    finally:
        for target in mounts.mounts_under(extra):
            mounts.umount(target)
        shutil.rmtree(extra, ignore_errors=True)
        await node.close(stop_sandboxes=True)
    assert str(state / "sandboxes") not in Path("/proc/self/mountinfo").read_text()


async def test_runc_does_not_see_other_sandboxes_mounts(spied):
    node, seen, sees_host = spied
    info = await node.create(SandboxSpec(memory_mb=32))
    assert seen.read_text().split() == [str(EXTRA) if sees_host else "0"]
    own = await run(node, info.id, "echo hi > /dev/shm/s && cat /dev/shm/s && hostname")
    assert own.stdout.split() == ["hi", info.id], own.stderr


async def test_the_host_side_verbs_work_on_a_sandbox_runc_started_apart(spied):
    """runc's state names the bundle path only its own namespace had: the node's stop,
    pause, files, pack_diff and `runc delete` must still find everything from the host's."""
    node, _, _ = spied
    info = await node.create(SandboxSpec(memory_mb=32))
    with (await node.files(info.id)).open_write("/root/a.txt") as f:
        f.write(b"from the host")
    assert (await run(node, info.id, "cat /root/a.txt")).stdout == "from the host"
    await run(node, info.id, "echo made > /root/b.txt")
    with (await node.files(info.id)).open_read("/root/b.txt") as f:
        assert f.read() == b"made\n"
    await node.pause(info.id)
    await node.resume(info.id)
    assert (await run(node, info.id, "echo back")).stdout.strip() == "back"
    img = await node.pack_diff(info.id, PackDiffRequest(tag="workspace/apart:v1"))
    assert img.layers == 2
    rec = node.record(info.id)
    backend = node.backends["container"]
    rc, err = await backend._runc("state", info.id)
    assert rc == 0, err
    init = rec.runtime["init_pid"]
    await node.stop(info.id)
    assert not Path(f"/proc/{init}").exists()
    assert not Path(rec.runtime["dir"]).exists()
    assert info.id not in Path("/proc/self/mountinfo").read_text()


async def test_runc_delete_ends_a_sandbox_started_apart(spied):
    node, _, _ = spied
    info = await node.create(SandboxSpec(memory_mb=32))
    backend = node.backends["container"]
    rc, err = await backend._runc("delete", "--force", info.id)
    assert rc == 0, err
    assert not (backend.runc_root / info.id).exists()
    await node.stop(info.id)
