"""Remote store: HTTP blob router, on-demand chunk loading through FUSE, full pulls."""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from dsec.api.errors import Internal, NotFound
from dsec.images import CorruptBlob, ImageService
from dsec.images.http import blob_router
from dsec.images.remote import ChunkCache, RemoteStore
from dsec.images.sources import RemoteConfig
from dsec.images.store import CHUNK_SIZE

from .conftest import mounts_under


@pytest.fixture
def registry(tmp_path):
    """A store with busybox and a 3 MiB layer, served over HTTP on loopback."""
    reg = ImageService(tmp_path / "registry")
    reg.ensure_busybox()
    src = tmp_path / "big"
    src.mkdir()
    for i in range(12):
        (src / f"f{i}").write_bytes(os.urandom(256 << 10))
    (src / "small").write_text("hello")
    reg.commit("ws/big:v1", [reg.add_layer_dir(src)])
    app = FastAPI()
    app.include_router(blob_router(reg))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield reg, f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)
    reg.unmount_all()
    assert not mounts_under(tmp_path / "registry")


@pytest.fixture
def node(tmp_path, registry):
    svc = ImageService(tmp_path / "node", remote=registry[1])
    yield svc
    svc.unmount_all()
    assert not mounts_under(tmp_path / "node")
    assert not svc.sources.daemon.alive()


def test_router_serves_ranges_manifests_and_errors(registry):
    reg, url = registry
    digest = reg.manifest("busybox").layers[0].digest
    blob = reg.store.blob_path(digest).read_bytes()
    with httpx.Client(base_url=url) as c:
        r = c.get(f"/v1/blobs/{digest}", headers={"Range": "bytes=1024-2047"})
        assert r.status_code == 206 and r.content == blob[1024:2048]
        m = c.get("/v1/manifests/busybox")
        assert m.headers["Dsec-Content-Digest"] == reg.manifest_digest("busybox")
        assert m.content == reg.store.manifest_bytes(reg.manifest_digest("busybox"))
        assert c.get("/v1/manifests/workspace/none:v1").json()["error"]["code"] == "not_found"
        assert c.get("/v1/blobs/sha256:" + "0" * 64).status_code == 404
        assert len(c.get(f"/v1/blobs/{digest}/chunks").content) == 32 * -(-len(blob) // CHUNK_SIZE)


def test_lazy_resolve_fetches_only_what_is_read(node, registry, tmp_path):
    reg, _ = registry
    r = node.resolve("ws/big:v1")
    layer = r.layer_digests[0]
    assert not node.store.has_blob(layer)
    (point, fstype, source), = [m for m in mounts_under(tmp_path / "node") if m[1] == "erofs"]
    assert source == str(node.root / "lazy" / layer.split(":")[1])
    assert node.layer_file(layer) == node.root / "lazy" / layer.split(":")[1]
    assert (r.lowerdirs[0] / "small").read_text() == "hello"
    total = reg.manifest("ws/big:v1").layers[0].size
    fetched = node.bytes_fetched
    assert 0 < fetched < total / 2
    assert (r.lowerdirs[0] / "f3").read_bytes() == (registry[0].resolve("ws/big:v1").lowerdirs[0] / "f3").read_bytes()
    assert node.bytes_fetched > fetched


def test_chunk_cache_serves_a_remount_without_fetching(node, registry):
    r = node.resolve("ws/big:v1")
    data = (r.lowerdirs[0] / "f5").read_bytes()
    node.unmount_all()
    before = node.bytes_fetched
    r = node.resolve("ws/big:v1")
    assert (r.lowerdirs[0] / "f5").read_bytes() == data
    assert node.bytes_fetched == before


def test_full_pull_fetches_whole_layers_and_stores_them(tmp_path, registry):
    svc = ImageService(tmp_path / "pull", remote=RemoteConfig(url=registry[1], lazy=False))
    try:
        r = svc.resolve("ws/big:v1")
        assert svc.store.has_blob(r.layer_digests[0])
        assert svc.bytes_fetched == registry[0].manifest("ws/big:v1").layers[0].size
        assert (r.lowerdirs[0] / "small").read_text() == "hello"
    finally:
        svc.unmount_all()


def test_unknown_remote_image_is_not_found(node):
    with pytest.raises(NotFound, match="ws/none:v1"):
        node.resolve("ws/none:v1")


def test_corrupted_blob_on_the_server_is_refused(node, registry, tmp_path):
    reg, _ = registry
    digest = reg.manifest("ws/big:v1").layers[0].digest
    path = reg.store.blob_path(digest)
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.seek(5000)
        f.write(b"\x00\xff" * 8)
    with pytest.raises(Internal, match="corrupted"):
        node.resolve("ws/big:v1")
    assert not [m for m in mounts_under(tmp_path / "node") if m[1] == "erofs"]


def test_corrupted_chunk_from_the_wire_is_refused_and_not_cached(tmp_path, registry):
    reg, url = registry
    lr = reg.manifest("ws/big:v1").layers[0]
    real = httpx.Client(base_url=url)

    def handler(request: httpx.Request) -> httpx.Response:
        r = real.get(request.url.path, headers={k: v for k, v in request.headers.items()
                                                 if k.lower() == "range"})
        body = r.content
        if request.url.path.endswith(lr.digest) and "range" in request.headers:
            body = b"\x00" + body[1:]
        return httpx.Response(r.status_code, content=body)

    cache = ChunkCache(tmp_path / "cache")
    store = RemoteStore("http://registry", cache, transport=httpx.MockTransport(handler))
    table = store.chunk_table(lr.digest, lr.chunks)
    with pytest.raises(CorruptBlob, match="chunk 1 of layer"):
        store.read(lr.digest, CHUNK_SIZE, 10, table, lr.size)
    assert cache.get(lr.digest, 1) is None
    real.close()
    store.close()


def test_corrupted_cached_chunk_is_fetched_again(node):
    r = node.resolve("ws/big:v1")
    want = (r.lowerdirs[0] / "f2").read_bytes()
    node.unmount_all()
    cache = node.sources.cache
    layer = r.layer_digests[0]
    for p in (cache.root / layer.split(":")[1]).iterdir():
        if p.name.isdigit():
            p.write_bytes(b"\x00" * p.stat().st_size)
    before = node.bytes_fetched
    r = node.resolve("ws/big:v1")
    assert (r.lowerdirs[0] / "f2").read_bytes() == want
    assert node.bytes_fetched > before


def test_gc_drops_cached_chunks_of_unreferenced_layers(node, registry):
    r = node.resolve("ws/big:v1")
    (r.lowerdirs[0] / "f1").read_bytes()
    layer = r.layer_digests[0]
    assert layer in node.sources.cache.layers()
    assert node.gc(in_use={layer}, grace_s=0).layers == []
    node.untag("ws/big:v1")
    node.unmount_all()
    plan = node.gc(grace_s=0)
    assert plan.layers == [layer] and plan.bytes_freed > 0
    assert layer not in node.sources.cache.layers()


def test_concurrent_lazy_reads_return_the_right_bytes(node, registry):
    from concurrent.futures import ThreadPoolExecutor
    want_root = registry[0].resolve("ws/big:v1").lowerdirs[0]
    top = node.resolve("ws/big:v1").lowerdirs[0]
    names = [f"f{i}" for i in range(12)] * 2
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda n: (top / n).read_bytes(), names))
    assert got == [(want_root / n).read_bytes() for n in names]


def test_lazy_directory_knows_only_announced_layers(node):
    node.resolve("ws/big:v1")
    with pytest.raises(FileNotFoundError):
        os.stat(node.root / "lazy" / ("ab" * 32))
    with pytest.raises(FileNotFoundError):
        os.stat(node.root / "lazy" / "not-a-digest")


def test_pack_diff_on_a_lazy_node_pushes_only_the_new_layer(node, registry, tmp_path):
    from .conftest import overlay
    reg, url = registry
    base = node.resolve("ws/big:v1")
    with overlay(tmp_path, base.lowerdirs + node.resolve("busybox").lowerdirs, "sb") as (m, upper):
        (m / "small").write_text("changed")
        (m / "f0").unlink()
        info = node.pack_diff(upper, "ws/big:v2", node.resolve("ws/big:v1", ["busybox"]))
    before = set(reg.store.blob_digests())
    assert node.push("ws/big:v2") == info.manifest_digest
    assert set(reg.store.blob_digests()) - before == {info.digest}
    other = ImageService(tmp_path / "other", remote=url)
    try:
        top = other.resolve("ws/big:v2")
        with overlay(tmp_path, top.lowerdirs, "check", writable=False) as (m, _):
            assert (m / "small").read_text() == "changed"
            assert not (m / "f0").exists() and (m / "f1").exists()
    finally:
        other.unmount_all()


def test_uploads_are_checked(registry):
    reg, url = registry
    with httpx.Client(base_url=url) as c:
        r = c.put("/v1/blobs/sha256:" + "a" * 64, content=b"not that")
        assert r.status_code == 400 and "hashes to" in r.json()["error"]["message"]
        layer = {"digest": "sha256:" + "b" * 64, "size": 1}
        body = json.dumps({"layers": [layer], "created": "2026-01-01T00:00:00Z"})
        r = c.put("/v1/manifests/ws/x:v1", content=body)
        assert r.status_code == 404 and "push the layer first" in r.json()["error"]["message"]
        assert c.put("/v1/manifests/ws/x:v1", content=b"{}").status_code == 400
        assert c.head("/v1/blobs/sha256:" + "a" * 64).status_code == 404
    assert reg.store.get_tag("ws/x:v1") is None


def test_resolve_recovers_from_a_dead_lazy_daemon(node):
    r = node.resolve("ws/big:v1")
    want = (r.lowerdirs[0] / "small").read_text()
    proc = node.sources.daemon._proc
    proc.kill()
    proc.wait(10)
    r = node.resolve("ws/big:v1")
    assert (r.lowerdirs[0] / "f7").read_bytes()
    assert (r.lowerdirs[0] / "small").read_text() == want


def test_a_projects_snapshot_pulled_by_tag_stays_that_projects(node, registry):
    from dsec.api.scope import caller_scope
    reg, url = registry
    reg.commit("ws/a:v1", reg.manifest("busybox").layers, project="team/a")
    with httpx.Client(base_url=url) as c:
        assert c.get("/v1/manifests/ws/a:v1").headers["Dsec-Project"] == "team/a"
        assert "Dsec-Project" not in c.get("/v1/manifests/busybox").headers
    mark = caller_scope.set("team/b")
    try:
        with pytest.raises(NotFound):
            node.manifest_digest("ws/a:v1")  # pulled, but not B's to see
        assert node.store.tag_record("ws/a:v1")[1] == "team/a"
        with pytest.raises(NotFound):
            node.manifest_digest("ws/a:v1")  # nor pulled again
    finally:
        caller_scope.reset(mark)
    assert node.manifest_digest("ws/a:v1") == reg.manifest_digest("ws/a:v1")
