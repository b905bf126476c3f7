"""Fixtures for the image tests: a fresh store per test, every mount removed afterwards."""

from __future__ import annotations

import contextlib
import os
import pathlib
import stat
import subprocess

import pytest

from dsec.images import ImageService


def mounts_under(root: pathlib.Path) -> list[tuple[str, str, str]]:
    """(mount point, fstype, source) of every mount at or below ``root``."""
    out = []
    root_s = str(root)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, right = line.split(" - ", 1)
            point = left.split()[4].replace("\\040", " ")
            fstype, source = right.split()[:2]
            if point == root_s or point.startswith(root_s + "/"):
                out.append((point, fstype, source))
    return out


@pytest.fixture
def svc(tmp_path):
    """An ImageService on a fresh state dir; unmounts everything it mounted."""
    service = ImageService(tmp_path / "state")
    yield service
    service.unmount_all()
    left = mounts_under(tmp_path)
    assert not left, f"mounts left behind: {left}"


@pytest.fixture
def busybox(svc):
    """The busybox image's manifest digest."""
    return svc.ensure_busybox()


@contextlib.contextmanager
def overlay(tmp_path: pathlib.Path, lowerdirs, name: str = "ov", writable: bool = True):
    """Mount an overlay of ``lowerdirs`` (top-most first); yields (merged, upper)."""
    base = tmp_path / name
    merged, upper, work = base / "merged", base / "upper", base / "work"
    for d in (merged, upper, work):
        d.mkdir(parents=True, exist_ok=True)
    opts = "lowerdir=" + ":".join(str(p) for p in lowerdirs)
    if writable:
        opts += f",upperdir={upper},workdir={work}"
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, str(merged)], check=True)
    try:
        yield merged, upper
    finally:
        subprocess.run(["umount", str(merged)], check=True)


def snapshot(root: pathlib.Path) -> dict[str, tuple]:
    """Every path below ``root`` with its type, mode, owner and content or link target."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            rel = os.path.relpath(p, root)
            if stat.S_ISLNK(st.st_mode):
                what = os.readlink(p)
            elif stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    what = f.read()
            else:
                what = None
            out[rel] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, what)
    return out
