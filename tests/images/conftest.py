"""Fixtures for the image tests: a fresh store per test, every mount removed afterwards."""

from __future__ import annotations

import pathlib

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
