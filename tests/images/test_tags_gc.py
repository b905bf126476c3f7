"""Tags (atomic, last writer wins) and garbage collection."""

from __future__ import annotations

import os
import threading

import pytest

from dsec.api.errors import NotFound
from dsec.images import CorruptBlob
from dsec.images.gc import plan_gc

from .conftest import mounts_under

D = ["sha256:" + c * 64 for c in "0123456789"]


def _layer(svc, tmp_path, name, text):
    src = tmp_path / f"src-{name.replace('/', '_')}"
    src.mkdir()
    (src / "f").write_text(text)
    return svc.add_layer_dir(src)


def test_tag_moves_and_digest_stays(svc, busybox, tmp_path):
    m1 = svc.commit("ws/a:v1", [_layer(svc, tmp_path, "one", "1")])
    svc.tag("ws/a:latest", "ws/a:v1")
    m2 = svc.commit("ws/a:v1", [_layer(svc, tmp_path, "two", "2")])
    assert svc.manifest_digest("ws/a:v1") == m2 != m1
    assert svc.manifest_digest("ws/a:latest") == m1
    assert (svc.resolve(m1).lowerdirs[0] / "f").read_text() == "1"


def test_racing_tag_writers_leave_one_complete_tag(svc, busybox, tmp_path):
    digests = [svc.commit(None, [_layer(svc, tmp_path, f"r{i}", str(i))]) for i in range(4)]
    seen, stop = set(), threading.Event()

    def reader():
        while not stop.is_set():
            d = svc.store.get_tag("ws/race:v1")
            if d is not None:
                seen.add(d)

    t = threading.Thread(target=reader)
    t.start()
    writers = [threading.Thread(target=lambda d=d: [svc.tag("ws/race:v1", d) for _ in range(50)])
               for d in digests]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    stop.set()
    t.join()
    assert seen <= set(digests)
    assert svc.manifest_digest("ws/race:v1") in digests
    assert not list(svc.store.tmp.iterdir())


def test_untag_unknown_is_not_found(svc):
    with pytest.raises(NotFound):
        svc.untag("ws/none:v1")


def test_corrupted_manifest_is_refused(svc, busybox):
    path = svc.store.manifests / busybox.split(":")[1]
    path.write_bytes(path.read_bytes().replace(b'"root"', b'"evil"'))
    with pytest.raises(CorruptBlob, match="corrupted"):
        svc.resolve("busybox")


def test_manifest_naming_a_missing_layer_is_not_found(svc, busybox):
    layer = svc.manifest(busybox).layers[0].digest
    os.unlink(svc.store.blob_path(layer))
    with pytest.raises(NotFound, match=f"names layer {layer}"):
        svc.resolve("busybox")


def test_plan_gc_keeps_tagged_and_in_use():
    manifests = {D[0]: [D[5], D[6]], D[1]: [D[5], D[7]], D[2]: [D[8]]}
    plan = plan_gc({"a:1": D[0]}, manifests, {D[5], D[6], D[7], D[8], D[9]}, in_use={D[2]})
    assert plan.manifests == [D[1]]
    assert plan.layers == [D[7], D[9]]


def test_plan_gc_keeps_layers_in_use_without_manifest():
    plan = plan_gc({}, {}, {D[5], D[6]}, in_use={D[6]})
    assert plan.layers == [D[5]]


def test_gc_removes_unreferenced_layers_and_unmounts_them(svc, busybox, tmp_path):
    old = _layer(svc, tmp_path, "old", "old")
    svc.commit("ws/g:v1", [old])
    svc.resolve("ws/g:v1")
    new = _layer(svc, tmp_path, "new", "new")
    svc.commit("ws/g:v1", [new])
    assert svc.gc(grace_s=600).layers == []  # everything is young
    plan = svc.gc(grace_s=0)
    assert plan.layers == [old.digest] and plan.bytes_freed == old.size
    assert len(plan.manifests) == 1
    assert not svc.store.has_blob(old.digest)
    assert svc.store.has_blob(new.digest)
    assert str(svc.mounts.path(old.digest)) not in [m[0] for m in mounts_under(tmp_path)]
    assert (svc.resolve("busybox").lowerdirs[0] / "bin/sh").is_symlink()


def test_gc_keeps_layers_in_use(svc, busybox, tmp_path):
    old = _layer(svc, tmp_path, "old", "old")
    assert svc.gc(in_use={old.digest}, grace_s=0).layers == []
    assert svc.gc(grace_s=0).layers == [old.digest]
