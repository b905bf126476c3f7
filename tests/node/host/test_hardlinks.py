"""Hard links to protected files, on a plain directory used as a sandbox root (no server)."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from dsec.api.errors import Forbidden
from dsec.node.host.hardlinks import protected_inodes, stray_names
from dsec.node.host.rooted import RootedFiles


@pytest.fixture
def root(tmp_path):
    (tmp_path / "grader" / "sub").mkdir(parents=True)
    (tmp_path / "srv").mkdir()
    (tmp_path / "grader" / "secret.txt").write_bytes(b"secret")
    (tmp_path / "grader" / "sub" / "deep.txt").write_bytes(b"deep")
    (tmp_path / "grader" / "alone.txt").write_bytes(b"alone")
    (tmp_path / "hidden.sh").write_bytes(b"hidden")
    (tmp_path / "srv" / "h").hardlink_to(tmp_path / "grader" / "secret.txt")
    (tmp_path / "srv" / "deep").hardlink_to(tmp_path / "grader" / "sub" / "deep.txt")
    (tmp_path / "srv" / "hs").hardlink_to(tmp_path / "hidden.sh")
    (tmp_path / "srv" / "plain").write_bytes(b"plain")
    (tmp_path / "srv" / "twin1").write_bytes(b"twin")  # linked, but not to a protected file
    (tmp_path / "srv" / "twin2").hardlink_to(tmp_path / "srv" / "twin1")
    return tmp_path


def test_only_multiply_linked_files_under_protected_paths_are_kept(root):
    files = RootedFiles(str(root), protected=("/grader", "/hidden.sh", "/missing"))
    found = protected_inodes(lambda p: files._open_raw(p, os.O_PATH), files.protected)
    ino = {(root / p).stat().st_ino: top for p, top in [
        ("grader/secret.txt", "/grader"), ("grader/sub/deep.txt", "/grader"),
        ("hidden.sh", "/hidden.sh")]}
    assert {i: top for (_d, i), top in found.items()} == ino  # alone.txt has one name


@pytest.mark.parametrize("path", ["/srv/h", "/srv/deep", "/srv/hs", "/srv/../srv/h"])
def test_a_hard_link_to_a_protected_file_is_refused(root, path):
    files = RootedFiles(str(root), protected=("/grader", "/hidden.sh"))
    with pytest.raises(Forbidden, match=f"{path} is protected: it is a hard link"):
        files.open_read(path)
    with pytest.raises(Forbidden, match="hard link"):
        files.open_write(path)
    with pytest.raises(Forbidden, match="hard link"):
        files.stat(path)
    assert (root / "grader" / "secret.txt").read_bytes() == b"secret"
    assert (root / "hidden.sh").read_bytes() == b"hidden"


def test_a_tar_holding_one_is_refused_before_its_first_byte(root):
    files = RootedFiles(str(root), protected=("/grader", "/hidden.sh"))
    with pytest.raises(Forbidden, match="/srv/.* is protected: it is a hard link"):
        files.tar_out("/srv")


def test_other_files_and_the_grading_identity_are_served(root):
    files = RootedFiles(str(root), protected=("/grader", "/hidden.sh"))
    assert files.open_read("/srv/plain").read() == b"plain"
    assert files.open_read("/srv/twin2").read() == b"twin"
    grader = RootedFiles(str(root))  # no protected paths: the grading identity
    assert grader.open_read("/srv/h").read() == b"secret"
    with tarfile.open(fileobj=io.BytesIO(b"".join(grader.tar_out("/srv")))) as tf:
        assert "srv/h" in tf.getnames()


def test_stray_names_are_those_outside_every_protected_path(root):
    files = RootedFiles(str(root))
    found = stray_names(files.open_path, ("/grader", "/hidden.sh"))
    assert sorted(found) == [("/grader/secret.txt", 2, 1), ("/grader/sub/deep.txt", 2, 1),
                             ("/hidden.sh", 2, 1)]
    assert stray_names(files.open_path, ("/grader", "/hidden.sh", "/srv")) == []
