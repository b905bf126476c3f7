"""merge: consecutive layers become one without changing the image's filesystem."""

from __future__ import annotations

import os
import shutil
import stat

import pytest

from dsec.api.errors import InvalidArgument
from dsec.node.host import fdtree

from .conftest import overlay, snapshot


def _step(svc, tmp_path, base_ref, tag, name, fn):
    base = svc.resolve(base_ref)
    with overlay(tmp_path, base.lowerdirs, name) as (merged, upper):
        fn(merged)
        svc.pack_diff(upper, tag, base)


def _one(m):
    (m / "ws").mkdir()
    (m / "ws/a").write_text("a1")
    (m / "ws/gone").write_text("x")
    (m / "ws/dir").mkdir()
    (m / "ws/dir/inner").write_text("i")
    (m / "ws/becomes-dir").write_text("file")


def _two(m):
    (m / "ws/a").write_text("a2")
    (m / "ws/gone").unlink()
    (m / "bin/ls").unlink()
    shutil.rmtree(m / "etc")
    (m / "etc").mkdir()
    (m / "etc/passwd").write_text("root:x:0:0::/:/bin/sh\n")
    (m / "ws/becomes-dir").unlink()
    (m / "ws/becomes-dir").mkdir()
    (m / "ws/becomes-dir/f").write_text("now a dir")


def _three(m):
    shutil.rmtree(m / "ws/dir")
    (m / "ws/dir").mkdir()
    (m / "ws/dir/new").write_text("n")
    (m / "bin/cat").unlink()


@pytest.fixture
def stacked(svc, busybox, tmp_path):
    _step(svc, tmp_path, "busybox", "ws/m:1", "s1", _one)
    _step(svc, tmp_path, "ws/m:1", "ws/m:2", "s2", _two)
    _step(svc, tmp_path, "ws/m:2", "ws/m:3", "s3", _three)
    r = svc.resolve("ws/m:3")
    with overlay(tmp_path, r.lowerdirs, "orig", writable=False) as (merged, _):
        return snapshot(merged)


def _view(svc, tmp_path, tag, name):
    r = svc.resolve(tag)
    if len(r.lowerdirs) == 1:  # a read-only overlay needs two lower layers
        return r, snapshot(r.lowerdirs[0])
    with overlay(tmp_path, r.lowerdirs, name, writable=False) as (merged, _):
        return r, snapshot(merged)


def test_merge_upper_layers_keeps_whiteouts(svc, stacked, tmp_path):
    info = svc.merge("ws/m:3", "ws/m:merged", start=1)
    r, view = _view(svc, tmp_path, "ws/m:merged", "after")
    assert len(r.layer_digests) == 2 and r.layer_digests[1] == info.digest
    assert view == stacked
    assert "bin/ls" not in view and "etc/group" not in view and "ws/dir/inner" not in view
    st = os.lstat(r.lowerdirs[0] / "bin/cat")
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def test_merge_whole_image_drops_markers(svc, stacked, tmp_path):
    svc.merge("ws/m:3", "ws/m:flat")
    r, view = _view(svc, tmp_path, "ws/m:flat", "flat")
    assert len(r.layer_digests) == 1
    assert view == stacked
    for dirpath, dirnames, filenames in os.walk(r.lowerdirs[0]):
        for n in filenames:
            assert not stat.S_ISCHR(os.lstat(os.path.join(dirpath, n)).st_mode), n
        for n in dirnames:
            assert "trusted.overlay.opaque" not in os.listxattr(os.path.join(dirpath, n))


def test_merge_middle_range(svc, stacked, tmp_path):
    svc.merge("ws/m:3", "ws/m:mid", start=1, count=2)
    r, view = _view(svc, tmp_path, "ws/m:mid", "mid")
    assert len(r.layer_digests) == 3
    assert view == stacked


def test_merge_bad_range(svc, stacked):
    with pytest.raises(InvalidArgument, match="has 4 layers"):
        svc.merge("ws/m:3", "ws/m:x", start=3, count=2)


def test_merge_replaces_a_deep_directory(tmp_path):
    """A layer from a sandbox's pack_diff can nest a directory past Python's recursion limit
    (1000); a later layer replacing it must not end the merge in RecursionError."""
    from dsec.images.merge import merge_trees
    lower, upper, dest = tmp_path / "lower", tmp_path / "upper", tmp_path / "dest"
    for d in (lower, upper, dest):
        d.mkdir()
    fd = os.open(lower, os.O_RDONLY)
    for name in ["deep"] + ["d"] * 1500:
        os.mkdir(name, dir_fd=fd)
        nxt = os.open(name, os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    os.close(fd)
    (upper / "deep").write_text("now a file")
    try:
        merge_trees([lower, upper], dest, [])
        assert (dest / "deep").read_text() == "now a file"
    finally:  # pytest's own removal of old temp dirs recurses: it would fail on this tree
        top = os.open(lower, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fdtree.remove_tree(top, "deep")
        finally:
            os.close(top)
