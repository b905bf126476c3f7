"""File operations on a plain directory used as a sandbox root (no server)."""

from __future__ import annotations

import pytest

from dsec.api.errors import InvalidArgument
from dsec.node.host.rooted import RootedFiles


def test_removing_a_non_empty_directory_says_to_pass_recursive(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "f").write_bytes(b"x")
    with pytest.raises(InvalidArgument, match=r"^/m is a directory that is not empty; "
                                              r"pass recursive=True"):
        RootedFiles(str(tmp_path)).remove("/m")
    assert (tmp_path / "m" / "f").exists()
