"""The create-time hard-link check on an image's tree, remembered per image (no server)."""

from __future__ import annotations

import contextlib
import os

import pytest

from dsec.api.errors import InvalidArgument
from dsec.node.host.imagelinks import ImageLinks, merged_view


@pytest.fixture
def layer(tmp_path):
    root = tmp_path / "layer"
    (root / "grader").mkdir(parents=True)
    (root / "srv").mkdir()
    (root / "grader" / "secret.txt").write_bytes(b"secret")
    (root / "srv" / "h").hardlink_to(root / "grader" / "secret.txt")
    return root


def test_a_stray_name_is_refused_and_remembered(layer):
    links, opened = ImageLinks(), []

    def root():
        opened.append(1)
        return contextlib.nullcontext(str(layer))
    for _ in range(3):
        with pytest.raises(InvalidArgument, match="protected file /grader/secret.txt 1 more"):
            links.check(["sha256:a"], ["/grader"], root)
    links.check(["sha256:a"], ["/srv", "/grader"], root)  # both names protected: fine
    links.check(["sha256:a"], ["/grader", "/srv"], root)  # the same set, remembered
    assert len(opened) == links.walks == 2


def test_another_image_is_walked_again(layer, tmp_path):
    links = ImageLinks()
    plain = tmp_path / "plain"
    (plain / "grader").mkdir(parents=True)
    (plain / "grader" / "secret.txt").write_bytes(b"secret")
    links.check(["sha256:b"], ["/grader"], lambda: contextlib.nullcontext(str(plain)))
    with pytest.raises(InvalidArgument):
        links.check(["sha256:a"], ["/grader"], lambda: contextlib.nullcontext(str(layer)))
    assert links.walks == 2


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting an overlay needs root (CI runs as root)")
def test_the_merged_view_of_layers_shows_a_link_of_a_lower_layer(layer, tmp_path):
    top = tmp_path / "top"
    (top / "etc").mkdir(parents=True)
    work = tmp_path / "work"
    with merged_view([top, layer], work) as root:
        assert sorted(os.listdir(root)) == ["etc", "grader", "srv"]
        with pytest.raises(InvalidArgument, match="/grader/secret.txt"):
            ImageLinks().check(["sha256:t", "sha256:l"], ["/grader"],
                               lambda: contextlib.nullcontext(root))
    assert os.listdir(work) == []  # unmounted and removed
