"""The sandboxes directory as a mount of its own (runcns.py), on real bind mounts: made once,
idempotent, removed only when dsec made it and nothing is mounted under it."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsec.node.host import mounts
from dsec.node.host.runcns import MS_BIND, OwnMount, is_mount_target


def _table() -> str:
    return Path("/proc/self/mountinfo").read_text()


def _count(path: Path) -> int:
    return sum(1 for line in _table().splitlines() if line.split(" ")[4] == str(path))


@pytest.fixture
def own(tmp_path):
    m = OwnMount(tmp_path / "sandboxes", tmp_path / "sandboxes.bind")
    yield m
    for target in mounts.mounts_under(tmp_path):
        mounts.umount(target)


def test_made_once_private_and_idempotent(own):
    assert own.ensure() and own.ours()
    assert own.ensure()
    assert _count(own.directory) == 1
    line = next(ln for ln in _table().splitlines() if ln.split(" ")[4] == str(own.directory))
    assert "shared:" not in line and "master:" not in line  # private: propagates nowhere


def test_removed_on_release_when_ours_and_empty(own):
    own.ensure()
    assert own.release()
    assert _count(own.directory) == 0 and not own.ours()
    assert not own.release()


def test_kept_while_something_is_mounted_under_it(own):
    own.ensure()
    (own.directory / "sb").mkdir()
    mounts.mount("tmpfs", own.directory / "sb", "tmpfs", 0, "size=1m")
    assert not own.release()
    assert _count(own.directory) == 1 and own.ours()  # a restarted node may still remove it
    mounts.umount(own.directory / "sb")
    assert OwnMount(own.directory, own.marker).release()
    assert _count(own.directory) == 0


def test_a_mount_dsec_did_not_make_is_left_alone(own):
    own.directory.mkdir()
    mounts.mount(own.directory, own.directory, "", MS_BIND)
    assert own.ensure() and not own.ours()
    assert _count(own.directory) == 1
    assert not own.release()
    assert _count(own.directory) == 1


def test_not_made_over_mounts_already_under_it(own):
    (own.directory / "sb").mkdir(parents=True)
    mounts.mount("tmpfs", own.directory / "sb", "tmpfs", 0, "size=1m")
    assert not own.ensure()  # a bind would hide them from the node
    assert _count(own.directory) == 0 and not own.ours()


def test_mount_targets_are_read_unescaped():
    table = "36 27 0:31 / /a\\040b rw - tmpfs tmpfs rw\n37 27 0:32 / /c rw - tmpfs tmpfs rw\n"
    assert is_mount_target("/a b", table)
    assert is_mount_target("/c", table)
    assert not is_mount_target("/a", table) and not is_mount_target("/c/d", table)
