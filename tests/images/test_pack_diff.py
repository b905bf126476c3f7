"""pack_diff: a sandbox's upper dir becomes a layer that reproduces its state."""

from __future__ import annotations

import os
import shutil
import stat

import pytest

from dsec.api.errors import NotFound
from dsec.images.whiteout import OPAQUE_XATTR

from .conftest import overlay, snapshot


def _mutate(merged):
    (merged / "repo/sub").mkdir(parents=True)
    (merged / "repo/sub/a.py").write_text("print(1)\n")
    os.chmod(merged / "repo/sub/a.py", 0o751)
    os.chown(merged / "repo/sub/a.py", 1000, 1000)
    os.symlink("sub/a.py", merged / "repo/link")
    os.link(merged / "repo/sub/a.py", merged / "repo/hard")
    (merged / "etc/hostname").write_text("changed\n")
    (merged / "bin/ls").unlink()                    # whiteout
    shutil.rmtree(merged / "usr/sbin")              # whiteout of a whole directory
    shutil.rmtree(merged / "etc")                   # opaque dir once recreated
    (merged / "etc").mkdir()
    (merged / "etc/passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    os.setxattr(merged / "repo/sub/a.py", "user.note", b"kept")


def test_packed_layer_reproduces_the_sandbox_state(svc, busybox, tmp_path):
    base = svc.resolve("busybox")
    with overlay(tmp_path, base.lowerdirs, "sb1") as (merged, upper):
        _mutate(merged)
        before = snapshot(merged)
        info = svc.pack_diff(upper, "workspace/repo:v1", base)
    assert info.tag == "workspace/repo:v1" and info.id.startswith("lyr-")
    r = svc.resolve("workspace/repo:v1")
    assert r.layer_digests == base.layer_digests + [info.digest]
    assert r.manifest_digest == info.manifest_digest
    with overlay(tmp_path, r.lowerdirs, "sb2") as (merged2, _):
        after = snapshot(merged2)
        assert os.getxattr(merged2 / "repo/sub/a.py", "user.note") == b"kept"
        assert os.stat(merged2 / "repo/hard").st_ino == os.stat(merged2 / "repo/sub/a.py").st_ino
    assert "bin/ls" not in after and "usr/sbin" not in after
    assert "etc/group" not in after  # hidden by the opaque /etc
    assert after == before


def test_layer_keeps_overlay_markers_and_drops_bookkeeping(svc, busybox, tmp_path):
    base = svc.resolve("busybox")
    with overlay(tmp_path, base.lowerdirs) as (merged, upper):
        _mutate(merged)
        info = svc.pack_diff(upper, "ws/x:v1", base)
    top = svc.resolve("ws/x:v1").lowerdirs[0]
    st = os.lstat(top / "bin/ls")
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == 0
    assert os.getxattr(top / "etc", OPAQUE_XATTR) == b"y"
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            for x in os.listxattr(os.path.join(dirpath, name), follow_symlinks=False):
                assert not x.startswith("trusted.overlay.") or x == OPAQUE_XATTR, (name, x)
    assert info.size == svc.store.blob_path(info.digest).stat().st_size


def test_exclude_cleans_paths_before_packing(svc, busybox, tmp_path):
    base = svc.resolve("busybox")
    with overlay(tmp_path, base.lowerdirs) as (merged, upper):
        (merged / "root/.cache/pip").mkdir(parents=True)
        (merged / "root/.cache/pip/x").write_text("junk")
        (merged / "tmp/scratch").write_text("junk")
        (merged / "work").mkdir()
        (merged / "work/keep.txt").write_text("keep")
        (merged / "work/a.pyc").write_text("junk")
        svc.pack_diff(upper, "ws/clean:v1", base, exclude=["/root/.cache", "/tmp/", "*.pyc"])
    top = svc.resolve("ws/clean:v1").lowerdirs[0]
    assert (top / "work/keep.txt").read_text() == "keep"
    assert not (top / "root/.cache").exists()
    assert not (top / "tmp/scratch").exists()
    assert not (top / "work/a.pyc").exists()


def test_pack_diff_of_missing_upper_is_not_found(svc, busybox, tmp_path):
    with pytest.raises(NotFound, match="does not exist"):
        svc.pack_diff(tmp_path / "nope", "ws/x:v1", svc.resolve("busybox"))


def test_stacked_packs_build_on_each_other(svc, busybox, tmp_path):
    base = svc.resolve("busybox")
    with overlay(tmp_path, base.lowerdirs, "one") as (merged, upper):
        (merged / "f").write_text("1")
        svc.pack_diff(upper, "ws/s:v1", base)
    v1 = svc.resolve("ws/s:v1")
    with overlay(tmp_path, v1.lowerdirs, "two") as (merged, upper):
        assert (merged / "f").read_text() == "1"
        (merged / "f").unlink()
        (merged / "g").write_text("2")
        svc.pack_diff(upper, "ws/s:v2", v1)
    v2 = svc.resolve("ws/s:v2")
    assert len(v2.lowerdirs) == 3
    with overlay(tmp_path, v2.lowerdirs, "three", writable=False) as (merged, _):
        assert not (merged / "f").exists() and (merged / "g").read_text() == "2"


def test_userxattr_overlay_markers_are_packed_in_trusted_form(svc, busybox, tmp_path):
    upper = tmp_path / "upper"
    (upper / "etc").mkdir(parents=True)
    os.setxattr(upper / "etc", "user.overlay.opaque", b"y")
    os.setxattr(upper / "etc", "user.overlay.impure", b"y")
    (upper / "etc/motd").write_text("hi")
    svc.pack_diff(upper, "ws/ux:v1", svc.resolve("busybox"))
    top = svc.resolve("ws/ux:v1").lowerdirs[0]
    assert os.listxattr(top / "etc") == [OPAQUE_XATTR]


def test_file_swapped_for_a_symlink_is_never_followed(tmp_path):
    from dsec.images.stage import copy_entry
    upper = tmp_path / "upper"
    upper.mkdir()
    secret = tmp_path / "host-secret"
    secret.write_text("host only")
    (upper / "f").write_text("sandbox")
    st = os.lstat(upper / "f")
    (upper / "f").unlink()
    os.symlink(secret, upper / "f")  # the swap, after the walk saw a regular file

    import dsec.images.stage as stage
    assert stage._copy_regular(str(upper / "f"), str(tmp_path / "out"), st) is False
    assert not (tmp_path / "out").exists()
    assert copy_entry(str(upper / "f"), str(tmp_path / "out2"), {}) == 1
    assert os.readlink(tmp_path / "out2") == str(secret)
