"""dsec image pull from a real registry (Debian's docker-registry on loopback), filled by skopeo."""

from __future__ import annotations

import os
import stat

import pytest

from dsec.api.errors import InvalidArgument, NotFound
from dsec.images import ImageService
from dsec.images.registry import RegistryAuth, RegistryPolicy, check_insecure
from tests.images.conftest import mounts_under, overlay, snapshot
from tests.images.tarutil import d, entry, make_tar
from tests.support.registry import make_layout, run_registry, skopeo_copy

INSECURE = RegistryAuth(insecure=True)
BASE = make_tar([d("etc"), entry("etc/os-release", b"ID=test\n"), entry("etc/gone", b"x"),
                 d("cache"), entry("cache/old", b"old"), d("bin"),
                 entry("bin/tool", b"#!/bin/sh\n", mode=0o755)])
TOP = make_tar([d("etc"), entry("etc/.wh.gone"), d("cache"), entry("cache/.wh..wh..opq"),
                entry("cache/new", b"new"), entry("etc/added", b"added\n")])


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reg")
    with run_registry(tmp) as reg:
        layout = tmp / "layout"
        make_layout(layout, [BASE, TOP], env={"GREETING": "hi"}, cmd=["/bin/tool"])
        skopeo_copy(layout, reg.ref("team/env:v3"))
        skopeo_copy(layout, reg.ref("team/env:zstd"), "--dest-compress-format", "zstd")
        skopeo_copy(layout, reg.ref("team/env:docker"), "--format", "v2s2")
        multi = tmp / "multi"
        make_layout(multi, [BASE], platforms=["linux/arm64", "linux/amd64"])
        skopeo_copy(multi, reg.ref("team/multi:v1"), "--all")
        yield reg


def _tree(svc, tmp_path, ref):
    resolved = svc.resolve(ref)
    return resolved, overlay(tmp_path, resolved.lowerdirs, writable=False)


def test_pull_oci_image_honours_whiteouts_and_config(svc, registry, tmp_path):
    events = []
    info = svc.pull_registry(registry.ref("team/env:v3"), auth=INSECURE,
                             progress=lambda *a: events.append(a))
    assert info.name == registry.ref("team/env:v3") and info.layers == 2
    resolved, ov = _tree(svc, tmp_path, info.name)
    assert resolved.config.env == {"GREETING": "hi"}
    assert resolved.config.entrypoint == ["/bin/tool"]
    with ov as (merged, _):
        assert (merged / "etc/os-release").read_bytes() == b"ID=test\n"
        assert not (merged / "etc/gone").exists()          # whiteout
        assert sorted(os.listdir(merged / "cache")) == ["new"]  # opaque directory
        assert (merged / "etc/added").read_text() == "added\n"
        assert stat.S_IMODE((merged / "bin/tool").stat().st_mode) == 0o755
    assert {e[1] for e in events} >= {"fetch", "convert", "done"}
    assert not list(svc.store.tmp.iterdir())


def test_second_pull_fetches_no_layer(svc, registry):
    first = svc.pull_registry(registry.ref("team/env:v3"), auth=INSECURE)
    events = []
    again = svc.pull_registry(registry.ref("team/env:v3"), tag="copy:v1", auth=INSECURE,
                              progress=lambda *a: events.append(a))
    assert [e[1] for e in events] == ["present", "present"]
    assert svc.manifest(again.name).layers == svc.manifest(first.name).layers


@pytest.mark.parametrize("tag", ["zstd", "docker"])
def test_zstd_layers_and_docker_manifests_give_the_same_tree(svc, registry, tag, tmp_path):
    oci = svc.pull_registry(registry.ref("team/env:v3"), auth=INSECURE)
    svc2 = ImageService(tmp_path / "other")
    try:
        other = svc2.pull_registry(registry.ref(f"team/env:{tag}"), auth=INSECURE)
        with overlay(tmp_path, svc.resolve(oci.name).lowerdirs, "a", writable=False) as (a, _), \
                overlay(tmp_path, svc2.resolve(other.name).lowerdirs, "b",
                        writable=False) as (b, _):
            assert snapshot(a) == snapshot(b) and (b / "cache/new").read_bytes() == b"new"
    finally:
        svc2.unmount_all()


def test_manifest_list_picks_linux_amd64(svc, registry):
    info = svc.pull_registry(registry.ref("team/multi:v1"), auth=INSECURE)
    assert info.layers == 1


def test_pull_by_digest_is_tagged_by_digest(svc, registry):
    tagged = svc.pull_registry(registry.ref("team/env:v3"), auth=INSECURE)
    from dsec.images.registry import RegistryClient

    with RegistryClient(registry.host, INSECURE) as c:
        _, _, digest = c.manifest("team/env", "v3", "test")
    info = svc.pull_registry(registry.ref(f"team/env@{digest}"), auth=INSECURE)
    assert info.name == registry.ref(f"team/env:sha256-{digest[7:19]}")
    assert svc.manifest(info.name).layers == svc.manifest(tagged.name).layers


def test_unknown_tag_is_not_found(svc, registry):
    with pytest.raises(NotFound, match="team/env:nope"):
        svc.pull_registry(registry.ref("team/env:nope"), auth=INSECURE)
    assert not svc.store.tags() or set(svc.store.tags()) == set()


def test_create_pulls_on_first_use_only_when_allowed(tmp_path, registry):
    ref = registry.ref("team/env:v3")
    strict = ImageService(tmp_path / "a")
    with pytest.raises(NotFound, match="not found"):
        strict.resolve(ref)
    allowed = ImageService(tmp_path / "b", registry=RegistryPolicy(
        pull_on_first_use=True, insecure=[registry.host]))
    try:
        resolved = allowed.resolve(ref)
        assert len(resolved.lowerdirs) == 2 and allowed.store.get_tag(ref)
    finally:
        allowed.unmount_all()
    assert not mounts_under(tmp_path)


def test_plain_http_only_to_private_addresses():
    check_insecure("127.0.0.1:5000")
    check_insecure("10.1.2.3:5000")
    with pytest.raises(InvalidArgument, match="loopback or private"):
        check_insecure("8.8.8.8:5000")
