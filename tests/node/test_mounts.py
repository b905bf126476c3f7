"""A container sandbox's mounts on real runc: few superblocks (each costs kernel memory per
memory cgroup, so per sandbox in proportion to the sandboxes: issue 12), with the masked
paths still hidden and /dev/shm still a working, limited, non-executable shared memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsec.api.models import ExecRequest, SandboxSpec
from dsec.node.config import NodeConfig
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
