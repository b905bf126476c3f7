"""Image sources: hostile or odd metadata in OCI layouts and docker save tarballs."""

from __future__ import annotations

import json

import pytest

from dsec.api.errors import InvalidArgument, NotFound
from dsec.images import oci
from dsec.images.oci import open_image_source

from .tarutil import entry, make_tar
from .test_import import _oci_files, _sha, _write_dir, _write_tar


def test_docker_manifest_pointing_outside_the_archive_is_refused(tmp_path):
    files = {"manifest.json": json.dumps([{"Config": "../../etc/passwd", "RepoTags": ["a:1"],
                                           "Layers": []}]).encode()}
    with pytest.raises(InvalidArgument, match="outside the image"):
        with open_image_source(_write_tar(tmp_path / "x.tar", files)):
            pass


def test_malformed_metadata_is_invalid(tmp_path):
    files = {"manifest.json": json.dumps([{"RepoTags": ["a:1"]}]).encode()}
    with pytest.raises(InvalidArgument, match="malformed image metadata"):
        with open_image_source(_write_dir(tmp_path / "d", files)):
            pass


def test_bad_digest_in_index_is_invalid(tmp_path):
    files = _oci_files()
    files["index.json"] = json.dumps({"manifests": [{"digest": "sha256:../../x"}]}).encode()
    with pytest.raises(InvalidArgument, match="digest must look like"):
        with open_image_source(_write_dir(tmp_path / "d", files)):
            pass


def test_multi_platform_index_picks_this_machine(tmp_path):
    files = _oci_files()
    index = json.loads(files["index.json"])
    amd = dict(index["manifests"][0], platform={"architecture": oci._ARCH, "os": "linux"})
    other_layer = make_tar([entry("wrong", b"arm")])
    other = _oci_files(layers=(other_layer,))
    other_desc = dict(json.loads(other["index.json"])["manifests"][0],
                      platform={"architecture": "not-" + oci._ARCH, "os": "linux"})
    files.update({k: v for k, v in other.items() if k.startswith("blobs/")})
    nested = json.dumps({"schemaVersion": 2, "manifests": [other_desc, amd]}).encode()
    files[f"blobs/sha256/{_sha(nested).split(':')[1]}"] = nested
    files["index.json"] = json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.index.v1+json", "digest": _sha(nested),
        "size": len(nested)}]}).encode()
    with open_image_source(_write_dir(tmp_path / "d", files)) as image:
        assert len(image.layers) == 2


def test_unknown_ref_in_a_multi_image_archive_is_not_found(tmp_path):
    entries = [{"Config": "c.json", "RepoTags": ["a:1"], "Layers": []},
               {"Config": "c.json", "RepoTags": ["b:1"], "Layers": []}]
    files = {"manifest.json": json.dumps(entries).encode(), "c.json": b"{}"}
    with pytest.raises(NotFound, match="no image tagged 'c:1'"):
        with open_image_source(_write_tar(tmp_path / "x.tar", files), "c:1"):
            pass
    with open_image_source(_write_tar(tmp_path / "y.tar", files), "b:1") as image:
        assert image.name == "b:1"
