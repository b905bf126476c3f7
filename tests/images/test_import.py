"""Import: rootfs dir/tar, OCI image layout, docker save tarball."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile

import pytest

from dsec.api.errors import InvalidArgument, NotFound

from .conftest import overlay
from .tarutil import d, entry, make_tar

L1 = make_tar([d("bin"), entry("bin/tool", b"v1", mode=0o755), d("etc"),
               entry("etc/a", b"a"), entry("etc/b", b"b"), d("data"), entry("data/x", b"x")],
              compress=True)
L2 = make_tar([d("bin"), entry("bin/.wh.tool"), d("etc"), entry("etc/.wh..wh..opq"),
               entry("etc/c", b"c")], compress=True)
CONFIG = {"architecture": "amd64", "os": "linux",
          "config": {"Env": ["PATH=/bin", "LANG=C.UTF-8"], "WorkingDir": "/data",
                     "User": "1000", "Entrypoint": ["/bin/tool"], "Cmd": ["--x"],
                     "Labels": {"k": "v"}},
          "rootfs": {"type": "layers", "diff_ids": []}}


def _sha(b: bytes) -> str:
    return "sha256:" + hashlib.sha256(b).hexdigest()


def _oci_files(layers=(L1, L2), ref="v1", diff_ids=None):
    blobs = {}
    diff_ids = diff_ids or [_sha(gzip.decompress(x) if x[:2] == b"\x1f\x8b" else x)
                            for x in layers]
    cfg = json.dumps(dict(CONFIG, rootfs={"type": "layers", "diff_ids": diff_ids})).encode()
    blobs[_sha(cfg)] = cfg
    descs = []
    for layer in layers:
        blobs[_sha(layer)] = layer
        descs.append({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                      "digest": _sha(layer), "size": len(layer)})
    man = json.dumps({"schemaVersion": 2, "config": {"digest": _sha(cfg), "size": len(cfg),
                      "mediaType": "application/vnd.oci.image.config.v1+json"},
                      "layers": descs}).encode()
    blobs[_sha(man)] = man
    index = {"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": _sha(man),
        "size": len(man), "annotations": {"org.opencontainers.image.ref.name": ref}}]}
    files = {"oci-layout": b'{"imageLayoutVersion": "1.0.0"}',
             "index.json": json.dumps(index).encode()}
    files.update({f"blobs/sha256/{k.split(':')[1]}": v for k, v in blobs.items()})
    return files


def _write_dir(root, files):
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def _write_tar(path, files):
    with tarfile.open(path, "w") as tar:
        for name, data in files.items():
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tar.addfile(ti, io.BytesIO(data))
    return path


def _docker_save_files(layers):
    raw = [make_tar([d("bin"), entry("bin/tool", b"v1", mode=0o755)]), *layers]
    cfg = dict(CONFIG, rootfs={"type": "layers", "diff_ids": [_sha(r) for r in raw]})
    files = {"cfg.json": json.dumps(cfg).encode()}
    for i, r in enumerate(raw):
        files[f"l{i}/layer.tar"] = r
    files["manifest.json"] = json.dumps([{"Config": "cfg.json", "RepoTags": ["tools/t:1"],
                                          "Layers": [f"l{i}/layer.tar" for i in range(len(raw))]}]
                                        ).encode()
    return files


def _check_merged(svc, tmp_path, tag):
    r = svc.resolve(tag)
    with overlay(tmp_path, r.lowerdirs, "ov", writable=False) as (merged, _):
        assert not (merged / "bin/tool").exists()
        assert sorted(p.name for p in (merged / "etc").iterdir()) == ["c"]
        assert (merged / "data/x").read_bytes() == b"x"
    return r


def test_oci_layout_directory(svc, tmp_path):
    src = _write_dir(tmp_path / "layout", _oci_files())
    info = svc.import_image(src, "imp/oci:v1")
    assert info.layers == 2 and info.name == "imp/oci:v1"
    r = _check_merged(svc, tmp_path, "imp/oci:v1")
    assert r.config.env == {"PATH": "/bin", "LANG": "C.UTF-8"}
    assert (r.config.cwd, r.config.user) == ("/data", "1000")
    assert r.config.entrypoint == ["/bin/tool", "--x"] and r.config.labels == {"k": "v"}


def test_oci_layout_tar_uses_recorded_name(svc, tmp_path):
    src = _write_tar(tmp_path / "layout.tar", _oci_files(ref="imp/named:v2"))
    assert svc.import_image(src).name == "imp/named:v2"
    _check_merged(svc, tmp_path, "imp/named:v2")


def test_docker_save_tarball(svc, tmp_path):
    src = _write_tar(tmp_path / "saved.tar", _docker_save_files([
        make_tar([d("etc"), entry("etc/b", b"b")]),
        make_tar([d("bin"), entry("bin/.wh.tool"), d("etc"), entry("etc/.wh..wh..opq"),
                  entry("etc/c", b"c"), d("data"), entry("data/x", b"x")])]))
    info = svc.import_image(src)
    assert info.name == "tools/t:1" and info.layers == 3
    _check_merged(svc, tmp_path, "tools/t:1")


def test_docker_save_with_corrupted_layer_is_refused(svc, tmp_path):
    files = _docker_save_files([make_tar([entry("f", b"good")])])
    files["l1/layer.tar"] = make_tar([entry("f", b"evil")])
    with pytest.raises(InvalidArgument, match="l1/layer.tar is corrupted"):
        svc.import_image(_write_tar(tmp_path / "bad.tar", files))
    assert svc.list_images() == []


def test_oci_layout_with_corrupted_blob_is_refused(svc, tmp_path):
    files = _oci_files()
    name = f"blobs/sha256/{_sha(L2).split(':')[1]}"
    files[name] = L1
    with pytest.raises(InvalidArgument, match="corrupted"):
        svc.import_image(_write_dir(tmp_path / "layout", files), "imp/x:1")


def test_hostile_layer_is_refused_naming_the_entry(svc, tmp_path):
    files = _oci_files(layers=(make_tar([entry("../../etc/cron.d/x", b"evil")]),))
    with pytest.raises(InvalidArgument, match=r"tar entry '../../etc/cron.d/x'"):
        svc.import_image(_write_dir(tmp_path / "layout", files), "imp/x:1")


def test_not_an_image(svc, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidArgument, match="neither an OCI image layout"):
        svc.import_image(tmp_path / "empty", "imp/x:1")
    with pytest.raises(NotFound):
        svc.import_image(tmp_path / "missing", "imp/x:1")


def test_rootfs_directory_and_tar_as_layers(svc, busybox, tmp_path):
    src = tmp_path / "rootfs"
    (src / "opt").mkdir(parents=True)
    (src / "opt/tool").write_text("dir")
    a = svc.import_rootfs(src, "imp/dir:v1", base="busybox")
    tar = tmp_path / "rootfs.tar.gz"
    tar.write_bytes(make_tar([d("opt"), entry("opt/tool", b"tar")], compress=True))
    b = svc.import_rootfs(tar)
    assert b.manifest_digest is None and b.tag is None
    svc.commit("imp/tar:v1", [svc.layer_ref(b.digest)])
    assert (svc.resolve("imp/tar:v1").lowerdirs[0] / "opt/tool").read_text() == "tar"
    r = svc.resolve("imp/dir:v1")
    assert len(r.lowerdirs) == 2 and (r.lowerdirs[0] / "opt/tool").read_text() == "dir"
    assert r.config.env["PATH"]  # busybox's config carried over
    assert a.manifest_digest == r.manifest_digest


def _assert_nothing_imported(svc):
    assert svc.list_images() == [] and not list(svc.store.tmp.iterdir())


def test_oci_layout_whose_diff_id_does_not_match_is_refused(svc, tmp_path):
    # A hostile archive: the blob digests are right, the config claims other content.
    files = _oci_files(diff_ids=[_sha(gzip.decompress(L1)), _sha(b"something else")])
    blob = f"blobs/sha256/{_sha(L2).split(':')[1]}"
    with pytest.raises(InvalidArgument, match=rf"layer {blob} does not match the image "
                                              rf"config: .*diff_id is {_sha(b'something else')}"):
        svc.import_image(_write_dir(tmp_path / "layout", files), "imp/x:1")
    _assert_nothing_imported(svc)


def test_docker_save_blob_whose_diff_id_does_not_match_is_refused(svc, tmp_path):
    # Docker 25+ names each layer by its blob digest; the config's diff_id is a separate
    # claim about the uncompressed tar, and here it is a lie.
    raw = make_tar([d("bin"), entry("bin/tool", b"v1", mode=0o755)])
    blob = gzip.compress(raw)
    name = f"blobs/sha256/{_sha(blob).split(':')[1]}"
    cfg = dict(CONFIG, rootfs={"type": "layers", "diff_ids": [_sha(raw + b"x")]})
    files = {"cfg.json": json.dumps(cfg).encode(), name: blob,
             "manifest.json": json.dumps([{"Config": "cfg.json", "RepoTags": ["tools/t:1"],
                                           "Layers": [name]}]).encode()}
    with pytest.raises(InvalidArgument, match=rf"layer {name} does not match the image config"):
        svc.import_image(_write_tar(tmp_path / "saved.tar", files))
    _assert_nothing_imported(svc)


def test_config_without_a_diff_id_per_layer_is_refused(svc, tmp_path):
    files = _oci_files(diff_ids=[_sha(gzip.decompress(L1))])
    with pytest.raises(InvalidArgument, match="lists 1 diff_ids for 2 layers"):
        svc.import_image(_write_dir(tmp_path / "layout", files), "imp/x:1")
    _assert_nothing_imported(svc)
