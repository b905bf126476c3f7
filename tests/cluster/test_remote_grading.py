"""Protected paths over a remote node: the gateway tells the node's own HTTP API, through
its HttpNodeClient, whether the caller may grade (the ``grading`` parameter), and the node
takes that from a gateway holding the cluster credential only.

Real parts throughout: a node agent with the container backend (runc) serving its own API
on loopback, as a Ray node actor does (the same class, without Ray), and a gateway with
projects on SQLite over it (a StaticCluster of that one URL), both in this process.
"""

from __future__ import annotations

from types import SimpleNamespace

import httpx
import pytest

import dsec
from dsec.cluster.ray import _NodeActor
from dsec.cluster.static import StaticCluster
from dsec.gateway.app import create_app
from dsec.gateway.projects import Projects
from tests.support.gateway import serving
from tests.support.server import leftovers

CLUSTER = "dsec_test_grading_cluster"  # gateway -> node
ROOT = "dsec_test_grading_root"        # user -> gateway
SECRET = b"expected-answer-42\n"
PATH = "/grader/secret.txt"


@pytest.fixture
async def remote(tmp_path):
    """A project's sandbox with ``/grader`` protected, on a remote node; the secret is
    put there through the node's own API (so that each test says what the gateway does)."""
    state = tmp_path / "node"
    node = _NodeActor(str(state), CLUSTER, ["container"], host="127.0.0.1")
    _, node_url = await node.start()
    try:
        app = create_app(StaticCluster([node_url], CLUSTER), ROOT,
                         projects=Projects(ROOT, tmp_path / "projects.db"))
        async with serving(app) as url:
            async with dsec.AsyncClient(url, ROOT) as root:
                await root.projects.create("pg")
                tokens = {role: await root.projects.create_token("pg", role=role)
                          for role in ("user", "grader")}
                async with dsec.AsyncClient(url, tokens["user"]) as user, \
                        dsec.AsyncClient(url, tokens["grader"]) as grader:
                    sb = await user.create(memory_mb=128, protected_paths=["/grader"])
                    try:
                        await _put_on_the_node(node_url, sb.id)
                        g = await grader.get(sb.id)
                        yield SimpleNamespace(url=url, node_url=node_url, tokens=tokens,
                                              id=sb.id, user=sb, grader=g,
                                              admin=await root.get(sb.id))
                    finally:
                        await sb.stop()
    finally:
        await node.shutdown()
    assert not leftovers(state)


async def _put_on_the_node(node_url: str, sb_id: str) -> None:
    async with httpx.AsyncClient(base_url=node_url, timeout=30) as http:
        r = await http.put(f"/v1/sandboxes/{sb_id}/files", content=SECRET,
                           params={"path": PATH, "grading": "true"},
                           headers={"authorization": f"Bearer {CLUSTER}"})
    assert r.status_code == 200, r.text


async def test_a_grader_and_an_admin_read_a_protected_file_on_a_remote_node(remote):
    assert await remote.grader.files.read(PATH) == SECRET
    await remote.grader.files.write("/grader/answer.txt", b"42\n")
    assert await remote.admin.files.read("/grader/answer.txt") == b"42\n"
    assert await remote.admin.files.read(PATH) == SECRET
    assert sorted(e.name for e in await remote.grader.files.list("/grader")) == [
        "answer.txt", "secret.txt"]


async def test_a_user_token_is_refused_a_protected_file_on_a_remote_node(remote):
    with pytest.raises(dsec.Forbidden, match="/grader"):
        await remote.user.files.read(PATH)
    with pytest.raises(dsec.Forbidden, match="/grader"):
        await remote.user.files.write(PATH, b"forged")
    assert await remote.grader.files.read(PATH) == SECRET  # unchanged
    # asking for it at the gateway changes nothing: the gateway takes the token's role
    async with httpx.AsyncClient(base_url=remote.url, timeout=30, headers={
            "authorization": f"Bearer {remote.tokens['user']}"}) as http:
        r = await http.get(f"/v1/sandboxes/{remote.id}/files",
                           params={"path": PATH, "grading": "true"})
    assert r.status_code == 403, r.text


async def test_the_node_api_takes_grading_from_its_gateway_only(remote):
    url = f"/v1/sandboxes/{remote.id}/files"
    ask = {"path": PATH, "grading": "true"}
    async with httpx.AsyncClient(base_url=remote.node_url, timeout=30) as http:
        for token in (remote.tokens["user"], remote.tokens["grader"], ROOT):
            r = await http.get(url, params=ask, headers={"authorization": f"Bearer {token}"})
            assert r.status_code == 401, r.text  # not the cluster credential
        cluster = {"authorization": f"Bearer {CLUSTER}"}
        r = await http.get(url, params={"path": PATH}, headers=cluster)
        assert r.status_code == 403, r.text  # the gateway did not say the caller grades
        r = await http.get(url, params=ask, headers=cluster)
        assert r.status_code == 200 and r.content == SECRET
