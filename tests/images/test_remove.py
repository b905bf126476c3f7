"""Removing an image: its tag, and the manifest and layers nothing else keeps."""

from __future__ import annotations

import pytest

from dsec.api.errors import NotFound
from dsec.images.gc import plan_remove

from .conftest import mounts_under

D = ["sha256:" + c * 64 for c in "0123456789"]


def _layer(svc, tmp_path, name, text):
    src = tmp_path / f"src-{name}"
    src.mkdir()
    (src / "f").write_text(text)
    return svc.add_layer_dir(src)


def test_plan_remove_takes_only_what_no_one_else_keeps():
    manifests = {D[0]: [D[5], D[6]], D[1]: [D[5]], D[2]: [D[7]]}
    plan = plan_remove(D[0], {"base:v1": D[1]}, manifests, in_use=set())
    assert plan.manifests == [D[0]] and plan.layers == [D[6]]  # D[5] is base's too


def test_plan_remove_keeps_a_manifest_another_tag_names_or_a_sandbox_holds():
    manifests = {D[0]: [D[5]]}
    assert plan_remove(D[0], {"other:v1": D[0]}, manifests, set()).manifests == []
    assert plan_remove(D[0], {}, manifests, {D[0]}).manifests == []
    assert plan_remove(D[0], {}, manifests, {D[5]}).layers == []


def test_remove_deletes_the_tag_its_manifest_and_its_own_layer(svc, busybox, tmp_path):
    base_layers = svc.resolve("busybox").layer_digests
    own = _layer(svc, tmp_path, "own", "mine")
    svc.commit("grading/x:1", [*(svc.layer_ref(d) for d in base_layers), own])
    svc.resolve("grading/x:1")  # mounts its layers, as a sandbox start would
    blobs, manifests = svc.store.blob_digests(), set(svc.store.manifest_digests())
    plan = svc.remove("grading/x:1")
    assert plan.layers == [own.digest] and plan.bytes_freed == own.size
    assert svc.store.blob_digests() == blobs - {own.digest}
    assert set(svc.store.manifest_digests()) == manifests - set(plan.manifests)
    assert "grading/x:1" not in svc.store.tags()
    assert str(svc.mounts.path(own.digest)) not in [m[0] for m in mounts_under(tmp_path)]
    assert (svc.resolve("busybox").lowerdirs[0] / "bin/sh").is_symlink()  # base untouched


def test_remove_keeps_layers_in_use_and_refuses_an_unknown_tag(svc, busybox, tmp_path):
    own = _layer(svc, tmp_path, "own", "mine")
    svc.commit("ws/a:1", [own])
    assert svc.remove("ws/a:1", in_use={own.digest}).layers == []
    assert svc.store.has_blob(own.digest)
    with pytest.raises(NotFound):
        svc.remove("ws/a:1")
