"""Tags of a project's snapshots: seen only within the project (and above), never written
over a shared image's or another project's. Against a real store, no sandbox."""

from __future__ import annotations

from contextlib import contextmanager

import pytest

from dsec.api.errors import Conflict, Forbidden, InvalidArgument, NotFound
from dsec.api.scope import caller_scope


@contextmanager
def calling_as(project: str | None):
    mark = caller_scope.set(project)
    try:
        yield
    finally:
        caller_scope.reset(mark)


@pytest.fixture
def layers(svc):
    svc.ensure_busybox()
    return svc.manifest("busybox").layers


def test_a_projects_snapshot_is_its_own_and_its_parents(svc, layers):
    with calling_as("team/a"):
        assert svc.claim("ws/a:v1") == "team/a"
        digest = svc.commit("ws/a:v1", layers, project="team/a")
        assert svc.manifest_digest("ws/a:v1") == digest
    for who, sees in ((None, True), ("team", True), ("team/a", True), ("team/b", False),
                      ("team/a/x", False)):
        with calling_as(who):
            assert ("ws/a:v1" in [i.name for i in svc.list_images()]) is sees, who
            assert "busybox:latest" in [i.name for i in svc.list_images()]
            if sees:
                assert svc.manifest_digest("ws/a:v1") == digest
                continue
            with pytest.raises(NotFound) as hidden:
                svc.manifest_digest("ws/a:v1")
            with pytest.raises(NotFound) as missing:
                svc.manifest_digest("ws/none:v1")
            assert hidden.value.message.replace("ws/a:v1", "X") == \
                missing.value.message.replace("ws/none:v1", "X")
            with pytest.raises(NotFound):
                svc.check_visible(["busybox", "ws/a:v1"])


def test_a_project_writes_no_tag_but_its_own_and_no_registry_name(svc, layers):
    svc.commit("ws/shared:v1", layers)  # the root's: shared
    with calling_as("team/a"):
        svc.commit("ws/a:v1", layers, project="team/a")
    with calling_as("team/b"):
        for taken in ("ws/shared:v1", "ws/a:v1", "busybox"):
            with pytest.raises(Conflict, match="is taken"):
                svc.claim(taken)
            with pytest.raises(Conflict, match="is taken"):  # checked again as it is written
                svc.commit(taken, layers, project="team/b")
        with pytest.raises(InvalidArgument, match="registry"):
            svc.claim("registry.example:5000/team/env:v1")
    with calling_as("team"):  # a parent may replace its child's snapshot; it becomes its own
        svc.commit("ws/a:v1", layers, project="team")
    with calling_as("team/a"):
        with pytest.raises(NotFound):
            svc.manifest_digest("ws/a:v1")
    assert svc.store.tag_record("ws/shared:v1")[1] is None
    assert svc.claim("ws/shared:v1") is None  # the root's token writes shared tags


def test_a_project_removes_its_own_snapshots_only(svc, layers):
    with calling_as("team/a"):
        svc.commit("ws/a:v1", layers, project="team/a")
        svc.commit("ws/a:v2", layers, project="team/a")
        assert {i.name: i.project for i in svc.list_images()}["ws/a:v1"] == "team/a"
    with calling_as("team/b"):
        with pytest.raises(NotFound) as hidden:
            svc.remove("ws/a:v1")
        with pytest.raises(NotFound) as missing:
            svc.remove("ws/none:v1")
        assert hidden.value.message.replace("ws/a:v1", "X") == \
            missing.value.message.replace("ws/none:v1", "X")
        with pytest.raises(Forbidden, match="shared by every project"):
            svc.remove("busybox")
    with calling_as("team/a"):
        svc.remove("ws/a:v1")
    with calling_as("team"):  # a project above it may too
        svc.remove("ws/a:v2")
    assert {"ws/a:v1", "ws/a:v2"}.isdisjoint(i.name for i in svc.list_images())
    assert svc.manifest_digest("busybox")  # untouched
