"""Untrusted layer tars: hostile entries are refused, naming the entry; whiteouts converted."""

from __future__ import annotations

import io
import os
import stat
import tarfile

import pytest

from dsec.api.errors import InvalidArgument
from dsec.images.tarsafe import TarLimits, extract_layer
from dsec.images.whiteout import OPAQUE_XATTR

from .tarutil import d, entry, make_tar


def _extract(tmp_path, entries, limits=None, compress=False):
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    extract_layer(io.BytesIO(make_tar(entries, compress)), root, limits)
    return root


@pytest.mark.parametrize("entries,bad", [
    ([entry("../evil", b"x")], "../evil"),
    ([d("a"), entry("a/../../evil", b"x")], "a/../../evil"),
    ([entry("/etc/evil", b"x")], "/etc/evil"),
    ([entry("link", type=tarfile.SYMTYPE, linkname="../../etc")], "link"),
    ([d("a"), entry("a/up", type=tarfile.SYMTYPE, linkname="../../x")], "a/up"),
    ([entry("esc", type=tarfile.SYMTYPE, linkname="/etc"), entry("esc/passwd", b"x")],
     "esc/passwd"),
    ([entry("h", type=tarfile.LNKTYPE, linkname="/etc/shadow")], "h"),
    ([entry("h", type=tarfile.LNKTYPE, linkname="never-seen")], "h"),
    ([entry("null", type=tarfile.CHRTYPE, devmajor=1, devminor=3)], "null"),
    ([entry("sda", type=tarfile.BLKTYPE, devmajor=8, devminor=0)], "sda"),
    ([d("a"), entry("a/.wh...", b"")], "a/.wh..."),
])
def test_hostile_entries_are_rejected_by_name(tmp_path, entries, bad):
    with pytest.raises(InvalidArgument, match=f"tar entry '{bad}'"):
        _extract(tmp_path, entries)
    assert not os.path.exists(tmp_path / "evil")


def test_hard_link_through_a_swapped_symlink_is_rejected(tmp_path):
    entries = [d("x"), entry("x/f", b"1"), entry("x", type=tarfile.SYMTYPE, linkname="/etc"),
               entry("h", type=tarfile.LNKTYPE, linkname="x/passwd")]
    with pytest.raises(InvalidArgument, match="tar entry 'h'"):
        _extract(tmp_path, entries)


def test_size_limit_stops_a_tar_bomb_naming_the_entry(tmp_path):
    entries = [entry("a", b"x" * 600), entry("b", b"y" * 600)]
    with pytest.raises(InvalidArgument, match="tar entry 'b': layer exceeds the limit of 1000"):
        _extract(tmp_path, entries, TarLimits(max_bytes=1000))


def test_entry_count_limit(tmp_path):
    with pytest.raises(InvalidArgument, match="more than 2 entries"):
        _extract(tmp_path, [entry(f"f{i}") for i in range(3)], TarLimits(max_entries=2))


def test_setuid_is_cleared_unless_kept(tmp_path):
    root = _extract(tmp_path, [entry("su", b"#!", mode=0o4755), entry("sg", b"#!", mode=0o2755)])
    assert stat.S_IMODE(os.stat(root / "su").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(root / "sg").st_mode) == 0o755
    root2 = tmp_path / "k"
    root2.mkdir()
    extract_layer(io.BytesIO(make_tar([entry("su", b"#!", mode=0o4755)])), root2,
                  TarLimits(keep_setuid=True))
    assert stat.S_IMODE(os.stat(root2 / "su").st_mode) == 0o4755


def test_whiteouts_become_overlay_markers(tmp_path):
    root = _extract(tmp_path, [d("etc"), entry("etc/.wh..wh..opq"), entry("etc/passwd", b"r"),
                               d("bin"), entry("bin/.wh.ls")], compress=True)
    assert os.getxattr(root / "etc", OPAQUE_XATTR) == b"y"
    assert (root / "etc/passwd").read_bytes() == b"r"
    st = os.lstat(root / "bin/ls")
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == 0
    assert not (root / "bin/.wh.ls").exists()


def test_regular_layer_keeps_links_owners_and_absolute_symlinks(tmp_path):
    root = _extract(tmp_path, [d("bin"), entry("bin/busybox", b"ELF", mode=0o755, uid=7, gid=8),
                               entry("bin/sh", type=tarfile.SYMTYPE, linkname="/bin/busybox"),
                               entry("bin/ash", type=tarfile.LNKTYPE, linkname="bin/busybox"),
                               entry("./lib/rel", type=tarfile.SYMTYPE, linkname="../bin/sh")])
    assert os.readlink(root / "bin/sh") == "/bin/busybox"
    assert os.stat(root / "bin/ash").st_ino == os.stat(root / "bin/busybox").st_ino
    st = os.stat(root / "bin/busybox")
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (7, 8, 0o755)
    assert os.readlink(root / "lib/rel") == "../bin/sh"


def test_garbage_is_invalid(tmp_path):
    root = tmp_path / "g"
    root.mkdir()
    with pytest.raises(InvalidArgument, match="not a readable tar"):
        extract_layer(io.BytesIO(b"\x00garbage" * 100), root)
