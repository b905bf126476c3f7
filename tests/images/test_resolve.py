"""ensure_busybox, resolve, mounts, list_images: the API the container backend uses."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import time

import pytest

from dsec.api.errors import NotFound
from dsec.images import CorruptBlob, ImageService

from .conftest import mounts_under


def test_busybox_rootfs_has_shell_users_and_tmp(svc, busybox):
    r = svc.resolve("busybox")
    top = r.lowerdirs[0]
    assert os.readlink(top / "bin/sh") == "/bin/busybox"
    assert (top / "bin/busybox").stat().st_mode & 0o111
    assert "root:x:0:0" in (top / "etc/passwd").read_text()
    assert "nobody:x:65534" in (top / "etc/group").read_text()
    assert stat.S_IMODE((top / "tmp").stat().st_mode) == 0o1777
    assert (top / "etc/resolv.conf").read_text() == ""
    for d in ("proc", "sys", "dev", "root"):
        assert (top / d).is_dir()


def test_layers_are_mounted_file_backed_without_loop_devices(svc, busybox, tmp_path):
    r = svc.resolve("busybox")
    (mount,) = mounts_under(tmp_path)
    point, fstype, source = mount
    assert point == str(r.lowerdirs[0])
    assert fstype == "erofs"
    assert source == str(svc.store.blob_path(r.layer_digests[0]))
    assert not source.startswith("/dev/loop")


def test_resolve_twice_mounts_once(svc, busybox, tmp_path):
    a = svc.resolve("busybox")
    b = svc.resolve("busybox:latest")
    assert a.lowerdirs == b.lowerdirs
    assert len(mounts_under(tmp_path)) == 1
    assert a.image == "busybox" and b.image == "busybox:latest"
    assert a.manifest_digest == b.manifest_digest == busybox


def test_resolve_by_manifest_digest(svc, busybox):
    r = svc.resolve(busybox)
    assert r.manifest_digest == busybox
    assert r.config.env["PATH"].endswith("/bin")


def test_ensure_busybox_is_idempotent_and_fast(svc, busybox):
    t0 = time.monotonic()
    again = svc.ensure_busybox()
    assert again == busybox
    assert time.monotonic() - t0 < 0.2


def test_busybox_layer_is_reproducible(tmp_path):
    a = ImageService(tmp_path / "a")
    b = ImageService(tmp_path / "b")
    la = a.manifest(a.ensure_busybox()).layers
    lb = b.manifest(b.ensure_busybox()).layers
    assert la == lb


def test_unknown_image_names_known_ones(svc, busybox):
    with pytest.raises(NotFound, match=r"image 'nope' not found; known: busybox:latest"):
        svc.resolve("nope")


def test_unknown_extra_layer_is_not_found(svc, busybox):
    with pytest.raises(NotFound, match="toolkit/x:v1"):
        svc.resolve("busybox", ["toolkit/x:v1"])


def _layer_from(svc, tmp_path, name, files):
    src = tmp_path / f"src-{name}"
    for rel, text in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    layer = svc.add_layer_dir(src)
    return svc.commit(name, [layer])


def test_extra_layers_stack_top_most_first_in_a_real_overlay(svc, busybox, tmp_path):
    _layer_from(svc, tmp_path, "workspace/a:v1", {"repo/f": "a", "repo/only-a": "1"})
    _layer_from(svc, tmp_path, "toolkit/b:v1", {"repo/f": "b"})
    r = svc.resolve("busybox", ["workspace/a:v1", "toolkit/b:v1"])
    assert len(r.lowerdirs) == 3
    assert r.lowerdirs[-1] == svc.resolve("busybox").lowerdirs[0]
    merged = tmp_path / "merged"
    merged.mkdir()
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                    f"lowerdir={r.lowerdir_option}", str(merged)], check=True)
    try:
        assert (merged / "repo/f").read_text() == "b"
        assert (merged / "repo/only-a").read_text() == "1"
        assert (merged / "bin/sh").is_symlink()
    finally:
        subprocess.run(["umount", str(merged)], check=True)


def test_corrupted_blob_is_refused_and_never_mounted(svc, busybox, tmp_path):
    digest = svc.manifest(busybox).layers[0].digest
    blob = svc.store.blob_path(digest)
    os.chmod(blob, 0o644)
    with open(blob, "r+b") as f:
        f.seek(4096)
        f.write(b"\xff" * 16)
    with pytest.raises(CorruptBlob, match="corrupted"):
        svc.resolve("busybox")
    assert mounts_under(tmp_path) == []


def test_unmount_all_removes_every_mount(svc, busybox, tmp_path):
    svc.resolve("busybox")
    assert mounts_under(tmp_path)
    svc.unmount_all()
    assert mounts_under(tmp_path) == []
    # and resolving again mounts again
    assert (svc.resolve("busybox").lowerdirs[0] / "bin/busybox").exists()


def test_list_images_reports_tags_sizes_and_layers(svc, busybox, tmp_path):
    _layer_from(svc, tmp_path, "workspace/a:v1", {"x": "1"})
    infos = {i.name: i for i in svc.list_images()}
    assert set(infos) == {"busybox:latest", "workspace/a:v1"}
    bb = infos["busybox:latest"]
    assert bb.manifest_digest == busybox and bb.layers == 1
    assert bb.size == svc.store.blob_path(svc.manifest(busybox).layers[0].digest).stat().st_size


def test_concurrent_processes_resolve_to_one_mount(svc, busybox, tmp_path):
    code = textwrap.dedent(f"""
        import pathlib, sys
        from dsec.images import ImageService
        r = ImageService(pathlib.Path({str(svc.root.parent)!r})).resolve("busybox")
        print(r.lowerdirs[0])
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
             for _ in range(6)]
    outs = {p.communicate()[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(outs) == 1
    assert len(mounts_under(tmp_path)) == 1


def test_concurrent_threads_resolve_to_one_mount(svc, busybox, tmp_path):
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(8) as pool:
        dirs = set(pool.map(lambda _: tuple(svc.resolve("busybox").lowerdirs), range(16)))
    assert len(dirs) == 1
    assert len(mounts_under(tmp_path)) == 1


def test_layer_file_is_the_verified_blob(svc, busybox):
    digest = svc.manifest(busybox).layers[0].digest
    assert svc.layer_file(digest) == svc.store.blob_path(digest)
    with open(svc.store.blob_path(digest), "r+b") as f:
        f.write(b"junk")
    with pytest.raises(CorruptBlob):
        svc.layer_file(digest)


def test_layers_use_direct_io_so_pages_are_cached_once(svc, busybox):
    point = str(svc.resolve("busybox").lowerdirs[0])
    line = next(line for line in open("/proc/self/mountinfo") if line.split()[4] == point)
    assert "directio" in line.split(" - ", 1)[1]


def test_blob_corrupted_after_a_first_mount_is_refused_on_the_next(svc, busybox, tmp_path):
    digest = svc.resolve("busybox").layer_digests[0]
    svc.unmount_all()
    with open(svc.store.blob_path(digest), "r+b") as f:
        f.seek(8192)
        f.write(b"\x00\x01\x02")
    with pytest.raises(CorruptBlob):
        svc.resolve("busybox")
    assert mounts_under(tmp_path) == []
