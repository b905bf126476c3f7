"""A real registry (docker-registry on loopback) as the layer store: EROFS layers pushed as
artifacts, read by a cold store on demand in verified chunks, through the lazy FUSE file."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from dsec.api.errors import DSecError
from dsec.images import ImageService, RemoteConfig
from dsec.images.ocistore import artifact_tag
from tests.images.conftest import mounts_under, overlay
from tests.support.registry import run_registry

TAG = "ws/demo:1"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A registry holding TAG (busybox + a layer with a 3 MiB file), pushed by dsec."""
    tmp = tmp_path_factory.mktemp("ocistore")
    with run_registry(tmp) as reg:
        url = f"oci+http://{reg.host}/dsec/store"
        src = ImageService(tmp / "src", remote=RemoteConfig(url=url))
        src.ensure_busybox()
        root = tmp / "ws"
        (root / "srv").mkdir(parents=True)
        (root / "srv" / "big.bin").write_bytes(os.urandom(3 << 20))
        (root / "srv" / "hello").write_text("from the registry store\n")
        src.import_rootfs(root, TAG, None, "busybox")
        src.push(TAG)
        yield reg, url, src
        src.unmount_all()


def _cold(tmp_path, url, **kw) -> ImageService:
    return ImageService(tmp_path / "cold", remote=RemoteConfig(url=url, **kw))


def test_pushed_image_is_an_artifact_the_registry_lists(store):
    reg, _, src = store
    raw = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false",
                          f"docker://{reg.host}/dsec/store:{artifact_tag(TAG)}"],
                         capture_output=True, text=True, check=True).stdout
    doc = json.loads(raw)
    assert doc["artifactType"] == "application/vnd.dsec.image.v1"
    assert doc["config"]["digest"] == src.manifest_digest(TAG)
    assert len(doc["layers"]) == 2 * len(src.manifest(TAG).layers)


def test_cold_store_reads_only_what_it_touches(store, tmp_path):
    _, url, src = store
    cold = _cold(tmp_path, url)
    try:
        resolved = cold.resolve(TAG)
        with overlay(tmp_path, resolved.lowerdirs, writable=False) as (root, _):
            assert (root / "srv/hello").read_text() == "from the registry store\n"
        total = sum(lr.size for lr in cold.manifest(TAG).layers)
        assert 0 < cold.bytes_fetched < total - (2 << 20)  # the unread 3 MiB stayed away
    finally:
        cold.unmount_all()
    assert not mounts_under(tmp_path)


def test_cache_bound_holds_while_a_larger_file_is_read(store, tmp_path):
    _, url, src = store
    cold = _cold(tmp_path, url, cache_max_bytes=1 << 20)
    try:
        with overlay(tmp_path, cold.resolve(TAG).lowerdirs, writable=False) as (root, _):
            data = (root / "srv/big.bin").read_bytes()
        with overlay(tmp_path, src.resolve(TAG).lowerdirs, "src", writable=False) as (s, _):
            assert data == (s / "srv/big.bin").read_bytes()
        assert cold.sources.cache.chunk_bytes() <= 1 << 20
        assert cold.bytes_fetched >= 3 << 20
    finally:
        cold.unmount_all()


def test_full_pull_mode_fetches_whole_verified_blobs(store, tmp_path):
    _, url, src = store
    cold = _cold(tmp_path, url, lazy=False)
    try:
        resolved = cold.resolve(TAG)
        assert all(cold.store.has_blob(d) for d in resolved.layer_digests)
    finally:
        cold.unmount_all()


def test_corrupted_blob_in_the_registry_is_never_served(store, tmp_path):
    reg, url, src = store
    top = src.manifest(TAG).layers[-1].digest
    data = next(reg.storage.rglob(f"blobs/sha256/{top[7:9]}/{top[7:]}/data"))
    original = data.read_bytes()
    try:
        data.write_bytes(bytes(b ^ 0xFF for b in original))  # every chunk is wrong now
        cold = _cold(tmp_path, url)
        try:
            with pytest.raises((OSError, DSecError)):  # EIO, or the mount refused
                with overlay(tmp_path, cold.resolve(TAG).lowerdirs, writable=False) as (r, _):
                    (r / "srv/hello").read_text()
        finally:
            cold.unmount_all()
    finally:
        data.write_bytes(original)
