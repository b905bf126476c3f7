"""fdtree: walks and removals at any depth that never leave the tree they start in."""

import os

from dsec.node.host import fdtree


def _deep(top, depth: int) -> None:
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:  # by fd, as a sandbox's shell nests, past PATH_MAX
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            sub = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = sub
        os.close(os.open("f", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    finally:
        os.close(fd)


def test_walk_and_remove_past_recursion_limit_and_path_max(tmp_path):
    (tmp_path / "top").mkdir()
    _deep(tmp_path / "top", 2500)  # 5000 characters of path, 2500 levels
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        entries = list(fdtree.walk(fd, "top"))
        assert len(entries) == 2502 and entries[-1].path.endswith("/d/f")
        fdtree.remove_tree(fd, "top")
    finally:
        os.close(fd)
    assert os.listdir(tmp_path) == []


def test_remove_tree_does_not_follow_symlinks(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    (tmp_path / "top" / "sub").mkdir(parents=True)
    os.symlink(outside, tmp_path / "top" / "sub" / "link")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fdtree.remove_tree(fd, "top")
    finally:
        os.close(fd)
    assert sorted(os.listdir(tmp_path)) == ["outside"]
    assert (outside / "keep").read_text() == "x"
