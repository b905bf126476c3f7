"""dsec images pushed to a real registry as ordinary OCI images, read back by skopeo and dsec."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import tarfile

import pytest

from dsec.images import ImageService
from dsec.images.registry import RegistryAuth
from tests.images.conftest import overlay, snapshot
from tests.images.test_pull import BASE, TOP
from tests.support.registry import make_layout, run_registry, skopeo_copy

INSECURE = RegistryAuth(insecure=True)


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reg")
    with run_registry(tmp) as reg:
        make_layout(tmp / "layout", [BASE, TOP], env={"GREETING": "hi"}, cmd=["/bin/tool"])
        skopeo_copy(tmp / "layout", reg.ref("team/env:v3"))
        yield reg


def _layer_names(layout, desc) -> list[str]:
    data = (layout / "blobs" / "sha256" / desc["digest"][7:]).read_bytes()
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(data))) as tar:
        return tar.getnames()


def test_skopeo_reads_a_pushed_image_with_oci_whiteouts(svc, registry, tmp_path):
    pulled = svc.pull_registry(registry.ref("team/env:v3"), auth=INSECURE)
    digest = svc.push_registry(pulled.name, registry.ref("mine/env:v1"), INSECURE)
    out = tmp_path / "copy"
    subprocess.run(["skopeo", "copy", "--quiet", "--src-tls-verify=false",
                    f"docker://{registry.ref('mine/env:v1')}", f"oci:{out}:v1"], check=True)
    index = json.loads((out / "index.json").read_text())
    manifest = json.loads((out / "blobs/sha256" / index["manifests"][0]["digest"][7:])
                          .read_text())
    top = _layer_names(out, manifest["layers"][1])
    assert "etc/.wh.gone" in top and "cache/.wh..wh..opq" in top and "cache/new" in top
    config = json.loads((out / "blobs/sha256" / manifest["config"]["digest"][7:]).read_text())
    assert config["config"]["Env"] == ["GREETING=hi"] and config["config"]["Cmd"] == ["/bin/tool"]
    assert digest.startswith("sha256:")


def test_pulled_back_image_is_the_same_tree_and_reuses_layers(svc, registry, tmp_path):
    pulled = svc.pull_registry(registry.ref("team/env:v3"), auth=INSECURE)
    svc.push_registry(pulled.name, registry.ref("mine/env:v2"), INSECURE)
    events = []
    back = svc.pull_registry(registry.ref("mine/env:v2"), auth=INSECURE,
                             progress=lambda *a: events.append(a[1]))
    assert events == ["present", "present"]  # the layer map knows what they were
    assert svc.manifest(back.name).layers == svc.manifest(pulled.name).layers
    fresh = ImageService(tmp_path / "fresh")
    try:
        again = fresh.pull_registry(registry.ref("mine/env:v2"), auth=INSECURE)
        with overlay(tmp_path, svc.resolve(pulled.name).lowerdirs, "a", writable=False) as (a, _), \
                overlay(tmp_path, fresh.resolve(again.name).lowerdirs, "b",
                        writable=False) as (b, _):
            assert snapshot(a) == snapshot(b)
    finally:
        fresh.unmount_all()


def test_second_push_uploads_only_new_blobs(svc, busybox, registry):
    events = []
    svc.push_registry("busybox", registry.ref("mine/bb:v1"), INSECURE)
    svc.push_registry("busybox", registry.ref("mine/bb:v2"), INSECURE,
                      progress=lambda *a: events.append(a[1]))
    assert set(events) == {"present"}


def test_export_writes_a_layout_skopeo_inspects(svc, busybox, tmp_path):
    svc.export_oci("busybox", tmp_path / "out")
    r = subprocess.run(["skopeo", "inspect", f"oci:{tmp_path / 'out'}:latest"],
                       capture_output=True, text=True, check=True)
    assert json.loads(r.stdout)["Os"] == "linux"
