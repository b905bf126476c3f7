"""The warm pool hands out started sandboxes with the caller's limits, and refills."""

import asyncio
import time

import pytest

import dsec
from dsec.node.host.cgroups import ROOT, detect
from tests.support.server import ServerProcess, leftovers


@pytest.fixture
def pooled_server():
    srv = ServerProcess(extra_args=["--warm-pool", "busybox=3"]).start()
    yield srv
    srv.destroy()
    assert leftovers(srv.state_dir) == []


async def _pool_ids(srv) -> set[str]:
    """Pool members the node has recorded (started, not merely being started)."""
    from dsec.node.store import NodeStore
    store = NodeStore(srv.state_dir / "node.db")
    try:
        return {r.id for r in store.all() if r.state == "pooled"}
    finally:
        store.close()


# generous: in the cgroup2-only guest (QEMU without KVM here) three containers took over
# a minute to start on a busy host
POOL_WAIT_S = 240


async def _wait_pool(srv, n: int, listed: set[str]) -> set[str]:
    deadline = time.time() + POOL_WAIT_S
    pool: set[str] = set()
    while time.time() < deadline:
        pool = await _pool_ids(srv) - listed
        if len(pool) >= n:
            return pool
        await asyncio.sleep(0.2)
    raise AssertionError(f"pool did not fill: {len(pool)} of {n} pooled after {POOL_WAIT_S} s")


async def test_create_takes_a_pooled_sandbox_with_its_own_limits(pooled_server):
    srv = pooled_server
    pool = await _wait_pool(srv, 3, set())
    async with dsec.AsyncClient(srv.url, srv.token) as c:
        sb = await c.create(memory_mb=96, cpu=0.5, pids=50, disk_mb=8, labels={"k": "v"})
        try:
            assert sb.id in pool, "create should have used a pooled sandbox"
            assert (await sb.exec("hostname")).stdout.strip() == sb.id
            r = await sb.exec("dd if=/dev/zero of=/f bs=1M count=20")
            assert "No space left" in r.stderr, "disk_mb of the caller must apply"
            if detect().version == 1:
                lim = (ROOT / "memory" / "dsec" / sb.id / "memory.limit_in_bytes").read_text()
                assert int(lim) == 96 << 20
                assert (ROOT / "pids" / "dsec" / sb.id / "pids.max").read_text().strip() == "50"
            else:  # v2: make test-cgroup2
                d = ROOT / "dsec" / sb.id
                assert int((d / "memory.max").read_text()) == 96 << 20
                assert (d / "memory.swap.max").read_text().strip() == "0"
                assert (d / "cpu.max").read_text().split() == ["50000", "100000"]
                assert (d / "pids.max").read_text().strip() == "50"
            assert [i.id for i in await c.list(labels={"k": "v"})] == [sb.id]
            await _wait_pool(srv, 3, {sb.id})  # refilled
        finally:
            await sb.stop()


async def test_pool_is_not_listed_and_survives_a_restart(pooled_server):
    srv = pooled_server
    pool = await _wait_pool(srv, 3, set())
    async with dsec.AsyncClient(srv.url, srv.token) as c:
        assert await c.list() == []
    srv.kill()
    srv.proc = None
    srv.start()
    async with dsec.AsyncClient(srv.url, srv.token) as c:
        sb = await c.create()
        try:
            assert sb.id in pool
        finally:
            await sb.stop()


@pytest.fixture
def linked_pool_server(tmp_path):
    """A server whose warm pool holds a sandbox of an image in which /srv/h is a hard link
    to /grader/secret.txt (busybox plus that layer), made before the pool fills."""
    from dsec.images import ImageService
    root = tmp_path / "layer"
    (root / "grader").mkdir(parents=True)
    (root / "srv").mkdir()
    (root / "grader" / "secret.txt").write_bytes(b"expected-answer-42\n")
    (root / "srv" / "h").hardlink_to(root / "grader" / "secret.txt")
    srv = ServerProcess()
    images = ImageService(srv.state_dir)
    images.ensure_busybox()
    images.import_rootfs(root, "pool/linked:v1", base="busybox")
    images.unmount_all()
    srv.extra_args = ["--warm-pool", "pool/linked:v1=1"]
    srv.start()
    yield srv
    srv.destroy()
    assert leftovers(srv.state_dir) == []


async def test_a_pooled_create_refuses_an_image_linking_a_protected_file(linked_pool_server):
    srv = linked_pool_server
    pool = await _wait_pool(srv, 1, set())
    async with dsec.AsyncClient(srv.url, srv.token) as c:
        for _ in range(2):  # the second answer is the remembered one
            with pytest.raises(dsec.InvalidArgument,
                               match="protected file /grader/secret.txt 1 more name"):
                await c.create(image="pool/linked:v1", memory_mb=64,
                               protected_paths=["/grader"])
        # both names protected: allowed, and served by the same pooled sandbox (kept)
        sb = await c.create(image="pool/linked:v1", memory_mb=64,
                            protected_paths=["/grader", "/srv"])
        try:
            assert sb.id in pool
            r = await sb.exec("cat /srv/h /grader/secret.txt")
            assert r.exit_code != 0 and "expected-answer" not in r.stdout, r
        finally:
            await sb.stop()
