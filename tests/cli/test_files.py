"""dsec cp in both directions, files and directories."""

from __future__ import annotations

import filecmp
import os


def test_cp_file_round_trip(cli, sb, tmp_path):
    src = tmp_path / "data.bin"
    src.write_bytes(os.urandom(300_000))
    src.chmod(0o750)
    r = cli("cp", str(src), f"{sb.id}:/tmp/")
    assert r.returncode == 0, r.stderr
    assert sb.files.read("/tmp/data.bin") == src.read_bytes()
    assert sb.exec("stat -c %a /tmp/data.bin").stdout == "750\n"

    r = cli("cp", str(src), f"{sb.id}:/new/dir/")  # a trailing slash names a directory
    assert r.returncode == 0, r.stderr
    assert sb.files.read("/new/dir/data.bin") == src.read_bytes()

    back = tmp_path / "back.bin"
    r = cli("cp", f"{sb.id}:/tmp/data.bin", str(back))
    assert r.returncode == 0, r.stderr
    assert back.read_bytes() == src.read_bytes()
    assert back.stat().st_mode & 0o777 == 0o750


def test_cp_directory_round_trip(cli, sb, tmp_path):
    tree = tmp_path / "tree"
    (tree / "sub" / "deeper").mkdir(parents=True)
    (tree / "a.txt").write_text("a\n")
    (tree / "sub" / "b.txt").write_text("b\n")
    (tree / "sub" / "deeper" / "c.txt").write_text("c\n")
    r = cli("cp", str(tree), f"{sb.id}:/srv/copy")
    assert r.returncode == 0, r.stderr
    assert sb.exec("cat /srv/copy/a.txt /srv/copy/sub/deeper/c.txt").stdout == "a\nc\n"

    r = cli("cp", f"{sb.id}:/srv/copy", str(tmp_path / "back"))
    assert r.returncode == 0, r.stderr
    cmp = filecmp.dircmp(tree, tmp_path / "back")
    assert (cmp.left_only, cmp.right_only, cmp.diff_files) == ([], [], [])
    assert (tmp_path / "back" / "sub" / "deeper" / "c.txt").read_text() == "c\n"

    out = tmp_path / "into"
    out.mkdir()
    r = cli("cp", f"{sb.id}:/srv/copy", str(out))  # an existing dir: copied under its name
    assert r.returncode == 0, r.stderr
    assert (out / "copy" / "sub" / "b.txt").read_text() == "b\n"


def test_cp_errors(cli, sb, tmp_path):
    r = cli("cp", f"{sb.id}:/no/such/file", str(tmp_path / "x"))
    assert r.returncode == 1 and r.stderr.startswith("error: ")
    assert not (tmp_path / "x").exists()
    r = cli("cp", str(tmp_path / "missing"), f"{sb.id}:/tmp/x")
    assert r.returncode == 1 and r.stderr.startswith("error: ")
    assert cli("cp", "a", "b").returncode == 2  # a usage error: neither side is a sandbox
