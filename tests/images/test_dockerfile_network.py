"""Dockerfile RUN steps and the network: loopback only, unless the build names a permission.

The HTTP servers the RUN steps try to reach are real ones on this machine, each in a network
namespace of its own behind a veth (``tests.redteam.netpeer``): a build granted a permission
is plumbed like a sandbox, and a sandbox's namespace never reaches the host's own addresses
(loopback included), so a server there could not tell a granted permission from a refused one.
"""

from __future__ import annotations

import json

import pytest

from dsec.api.errors import InvalidArgument
from dsec.images import ImageService
from dsec.images.dockerfile import DockerfileError
from tests.images.conftest import mounts_under, overlay
from tests.redteam.conftest import dns_peer, peer  # noqa: F401 (fixtures)
from tests.redteam.netpeer import DNS_SERVER, PEER, PEER_PORT, PERMISSIONS, sandbox_links, sh

GET = f"wget -O /got.txt http://{PEER}:{PEER_PORT}/"


@pytest.fixture
def netsvc(tmp_path):
    """An ImageService whose node offers the test permissions (peer, docs, pkgs)."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "network.json").write_text(json.dumps(
        {"permissions": PERMISSIONS, "dns_upstreams": [DNS_SERVER],
         "build_subnet": "10.217.0.0/28"}))
    service = ImageService(state)
    service.ensure_busybox()
    yield service
    service.unmount_all()
    assert not mounts_under(tmp_path)
    assert not list(service.store.tmp.iterdir())
    assert not [n for n in sandbox_links() if n.startswith("dsvbld")], "build veth left"
    assert "dsec_bld" not in sh("nft list tables").stdout, "build host tables left"
    assert "dsec-build-" not in sh("ip netns list").stdout, "build netns left"


def _dockerfile(tmp_path, run: str):
    (tmp_path / "Dockerfile").write_text(f"FROM busybox\nRUN {run}\n")
    return tmp_path / "Dockerfile"


def test_run_without_a_permission_cannot_reach_the_server(peer, netsvc, tmp_path):
    with pytest.raises(DockerfileError, match="buildah exit"):
        netsvc.build_dockerfile(_dockerfile(tmp_path, GET), "team/net:v1")
    assert netsvc.store.get_tag("team/net:v1") is None


def test_run_with_the_permission_reaches_the_server(peer, netsvc, tmp_path):
    df = _dockerfile(tmp_path, f"{GET} && ls /sys/class/net > /nets.txt")
    netsvc.build_dockerfile(df, "team/net:v1", network={"peer": True})
    with overlay(tmp_path, netsvc.resolve("team/net:v1").lowerdirs, writable=False) as (r, _):
        assert "Directory listing" in (r / "got.txt").read_text()
        assert (r / "nets.txt").read_text().split() == ["eth0", "lo"]
    # the namespace is the build's: the next build without the permission is refused again
    with pytest.raises(DockerfileError, match="buildah exit"):
        netsvc.build_dockerfile(_dockerfile(tmp_path, GET), "team/net:v2")


def test_another_permission_does_not_open_the_server(peer, netsvc, tmp_path):
    with pytest.raises(DockerfileError, match="buildah exit"):
        netsvc.build_dockerfile(_dockerfile(tmp_path, GET), "team/net:v1",
                                network={"docs": True})


def test_unknown_permission_is_refused_naming_the_offered_ones(netsvc, tmp_path):
    with pytest.raises(InvalidArgument, match=r"\['internet'\].*offers \['docs', 'peer', "
                                              r"'pkgs'\]"):
        netsvc.build_dockerfile(_dockerfile(tmp_path, "true"), "team/net:v1",
                                network={"internet": True})


def test_a_domain_permission_resolves_only_its_names(dns_peer, netsvc, tmp_path):
    run = (f"wget -O /got.txt http://pkgs.test:{PEER_PORT}/ && "
           f"! nslookup other.test > /dev/null 2>&1 && echo refused > /other.txt")
    netsvc.build_dockerfile(_dockerfile(tmp_path, run), "team/dns:v1", network={"pkgs": True})
    with overlay(tmp_path, netsvc.resolve("team/dns:v1").lowerdirs, writable=False) as (r, _):
        assert (r / "got.txt").read_bytes()
        assert (r / "other.txt").read_text() == "refused\n"
