"""The agent is compiled once per source version and process: another state dir gets a copy."""

from __future__ import annotations

import os

from dsec.node.agent import build


def test_a_second_state_dir_gets_a_copy_not_a_compile(tmp_path, monkeypatch):
    monkeypatch.setattr(build, "_BUILT", {})  # this test's own; the session's stays
    first = build.ensure_agent(tmp_path / "a")
    compiled = []
    monkeypatch.setattr(build, "_compile", compiled.append)
    second = build.ensure_agent(tmp_path / "b")
    assert compiled == [] and second.parent == tmp_path / "b"
    assert second.read_bytes() == first.read_bytes() and os.access(second, os.X_OK)
    first.unlink()  # gone meanwhile, and so is the second: the next one compiles again
    second.unlink()
    monkeypatch.setattr(build, "_compile", lambda dest: (compiled.append(dest),
                                                         dest.write_bytes(b"x")))
    build.ensure_agent(tmp_path / "c")
    assert len(compiled) == 1
