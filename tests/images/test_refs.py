"""Pure reference parsing."""

import pytest

from dsec.api.errors import InvalidArgument
from dsec.images.refs import is_digest, layer_id, normalize_ref


@pytest.mark.parametrize("ref,want", [
    ("busybox", "busybox:latest"),
    ("python:3.11", "python:3.11"),
    ("workspace/django:4f2a1c", "workspace/django:4f2a1c"),
    ("a/b", "a/b:latest"),
])
def test_normalize(ref, want):
    assert normalize_ref(ref) == want


@pytest.mark.parametrize("ref", ["", "UPPER", "../x", "a//b", "a/", "x:bad/tag", "x:", "a b"])
def test_bad_refs_are_rejected(ref):
    with pytest.raises(InvalidArgument):
        normalize_ref(ref)


def test_digests():
    d = "sha256:" + "ab" * 32
    assert is_digest(d) and normalize_ref(d) == d
    assert layer_id(d) == "lyr-" + "ab" * 6
    assert not is_digest("sha256:xyz")
