"""A cold node loads an image from another node's layer store on demand."""

import asyncio

import pytest

import dsec
from dsec.images import ImageService
from tests.support.server import ServerProcess, leftovers


@pytest.fixture
def cold_node(server):
    import os
    os.environ["DSEC_IMAGES_TOKEN"] = server.token
    srv = ServerProcess(extra_args=["--images-remote", server.url]).start()
    yield srv
    srv.destroy()
    assert leftovers(srv.state_dir) == []


async def test_cold_node_runs_an_image_it_never_had(server, cold_node, tmp_path):
    root = tmp_path / "ws"
    (root / "srv").mkdir(parents=True)
    (root / "srv" / "data.bin").write_bytes(b"x" * (3 << 20))
    (root / "srv" / "hello").write_text("from the remote store\n")
    await asyncio.to_thread(ImageService(server.state_dir).import_rootfs, root,
                            "workspace/remote-demo:1", None, "busybox")
    async with dsec.AsyncClient(cold_node.url, cold_node.token) as c:
        sb = await c.create(image="workspace/remote-demo:1", memory_mb=64)
        try:
            assert (await sb.exec("cat /srv/hello")).stdout == "from the remote store\n"
        finally:
            await sb.stop()
    cold = ImageService(cold_node.state_dir)
    assert "workspace/remote-demo:1" in {i.name for i in cold.list_images()}
    chunks = cold_node.state_dir / "images" / "chunks"
    fetched = sum(p.stat().st_size for p in chunks.rglob("*") if p.is_file())
    assert 0 < fetched < (3 << 20), f"fetched {fetched} bytes: the unread 3 MiB file came too"


async def test_cold_node_runs_an_image_from_a_registry_store(tmp_path):
    """The same, with an OCI registry (docker-registry on loopback) as the shared store."""
    from dsec.images import RemoteConfig
    from tests.support.registry import run_registry

    with run_registry(tmp_path / "reg") as reg:
        url = f"oci+http://{reg.host}/dsec/store"
        src = ImageService(tmp_path / "src", remote=RemoteConfig(url=url))
        try:
            src.ensure_busybox()
            root = tmp_path / "ws"
            (root / "srv").mkdir(parents=True)
            (root / "srv" / "hello").write_text("from the registry\n")
            await asyncio.to_thread(src.import_rootfs, root, "workspace/reg-demo:1", None,
                                    "busybox")
            await asyncio.to_thread(src.push, "workspace/reg-demo:1")
        finally:
            src.unmount_all()
        srv = ServerProcess(extra_args=["--images-remote", url]).start()
        try:
            async with dsec.AsyncClient(srv.url, srv.token) as c:
                sb = await c.create(image="workspace/reg-demo:1", memory_mb=64)
                try:
                    assert (await sb.exec("cat /srv/hello")).stdout == "from the registry\n"
                finally:
                    await sb.stop()
            assert ImageService(srv.state_dir).bytes_fetched > 0
        finally:
            srv.destroy()
        assert leftovers(srv.state_dir) == []
