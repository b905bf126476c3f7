"""Multi-tenancy in the cluster mode: a gateway process over two node agent processes
(``agents`` in conftest.py), real containers on both. What tests/gateway/test_tenancy.py
checks in the embedded mode, with the sandboxes, snapshots and leases spread over nodes.

Layout: ``<name>`` with two children ``<name>/a`` and ``<name>/b``; another project's
object answers exactly what a missing one does (status and body, up to the id).
"""

from __future__ import annotations

import asyncio
import secrets

import httpx
import pytest

import dsec
from tests.gateway.test_tenancy import (_call, _missing, _pty_answer, _sandbox_routes,
                                        _shape, _untouched)


class Tenants:
    """Tokens of the parent and both children by ``child:role``, raw clients with them."""

    def __init__(self, cluster, name: str, tokens: dict[str, str]) -> None:
        self.cluster, self.url, self.name, self.tokens = cluster, cluster.url, name, tokens
        self.http = {k: httpx.AsyncClient(base_url=cluster.url, timeout=60,
                                          headers={"authorization": f"Bearer {t}"})
                     for k, t in {**tokens, "root": cluster.token}.items()}

    def sdk(self, key: str) -> dsec.AsyncClient:
        return dsec.AsyncClient(self.url, self.tokens.get(key, self.cluster.token))

    async def on_node(self, who: str, node: str, **spec) -> str:
        """A sandbox of ``who`` on ``node`` (short id): creates until placement puts one
        there, then stops the others. They are kept meanwhile: placement sees what each
        node holds (a node's create answer says so), so a sandbox made and stopped on the
        emptier node would have the next create placed there again."""
        http, others = self.http[who], []
        try:
            for _ in range(24):
                r = await http.post("/v1/sandboxes", json={"memory_mb": 64, **spec})
                assert r.status_code == 201, r.text
                sb = r.json()["id"]
                if self.cluster.node_of(sb) == node:
                    return sb
                others.append(sb)
        finally:
            for sb in others:
                await http.delete(f"/v1/sandboxes/{sb}")
        raise AssertionError(f"placement put no sandbox on {node}")

    async def close(self) -> None:
        for h in self.http.values():
            await h.aclose()


@pytest.fixture
async def tenants(agents):
    name = f"c{secrets.token_hex(4)}"
    tokens = {}
    async with dsec.AsyncClient(agents.url, agents.token) as root:
        await root.projects.create(name)
        tokens["parent"] = await root.projects.create_token(name, role="admin")
        for child in ("a", "b"):
            await root.projects.create(f"{name}/{child}")
            for role in ("viewer", "user", "admin"):
                tokens[f"{child}:{role}"] = await root.projects.create_token(
                    f"{name}/{child}", role=role)
        t = Tenants(agents, name, tokens)
        try:
            yield t
        finally:
            await t.close()
            await root.stop_all()


def _two(agents) -> tuple[str, str]:
    x, y = sorted(agents.nodes)
    return x, y


async def _victim(t: Tenants, node: str) -> dict[str, str]:
    """A's sandbox on ``node`` with an open shell and a running background process."""
    a = t.http["a:user"]
    sb = await t.on_node("a:user", node)
    sh = (await a.post(f"/v1/sandboxes/{sb}/shells")).json()["id"]
    pid = (await a.post(f"/v1/sandboxes/{sb}/processes",
                        json={"cmd": "sleep 600", "stdin_open": True})).json()["pid"]
    return {"sb_id": sb, "sh_id": sh, "pid": str(pid)}


# ---- sandboxes on either node ----

async def test_every_sandbox_route_answers_another_project_as_a_missing_id_on_each_node(
        agents, tenants):
    doc = (await tenants.http["root"].get("/openapi.json")).json()
    routes = _sandbox_routes(doc)
    wrong = []
    for node in _two(agents):
        victim = await _victim(tenants, node)
        theirs = await tenants.on_node("parent", node)
        gone = {"sb_id": _missing(victim["sb_id"]), "sh_id": "sh-" + secrets.token_hex(6),
                "pid": victim["pid"]}
        pairs = [("b:user", victim), ("a:user", {**victim, "sb_id": theirs})]
        for method, path, op in routes:
            for who, ids in pairs:
                http = tenants.http[who]
                got = await http.request(**_call(method, path, op, ids))
                want = await http.request(**_call(method, path, op, gone))
                if got.status_code != 404 or _shape(got, *ids.values()) != \
                        _shape(want, *gone.values()):
                    wrong.append(f"{node} {who} {method} {path}: {got.status_code} "
                                 f"{got.text[:160]} (missing: {want.status_code} "
                                 f"{want.text[:160]})")
        await _untouched(tenants.http["a:user"], victim)
    assert not wrong, "\n".join(wrong)


async def test_the_terminal_on_a_node_answers_another_project_as_a_missing_id(
        agents, tenants):
    """It once closed at once with no word (code 1000, as a terminal that ended well): the
    node's not_found came to the gateway as its first frame and was dropped there."""
    victim = await _victim(tenants, _two(agents)[0])
    sb, gone = victim["sb_id"], _missing(victim["sb_id"])
    token = tenants.tokens["b:user"]
    answer = await _pty_answer(agents.url, token, sb)
    assert '"not_found"' in answer, answer
    assert answer.replace(sb, "ID") == \
        (await _pty_answer(agents.url, token, gone)).replace(gone, "ID")
    assert '"not_found"' in await _pty_answer(agents.url, tenants.tokens["a:user"], gone)
    await _untouched(tenants.http["a:user"], victim)


async def test_a_viewer_changes_nothing_and_a_revoked_token_reaches_nothing_on_a_node(
        agents, tenants):
    doc = (await tenants.http["root"].get("/openapi.json")).json()
    victim = await _victim(tenants, _two(agents)[1])
    async with tenants.sdk("root") as root:
        made = await root.projects.create_token_info(f"{tenants.name}/a", role="admin")
        await root.projects.revoke_token(made.id)
    wrong = []
    async with httpx.AsyncClient(base_url=agents.url, timeout=60, headers={
            "authorization": f"Bearer {made.token}"}) as revoked:
        for method, path, op in _sandbox_routes(doc):
            req = _call(method, path, op, victim)
            if method not in ("GET", "HEAD"):
                r = await tenants.http["a:viewer"].request(**req)
                if r.status_code != 403:
                    wrong.append(f"viewer {method} {path}: {r.status_code} {r.text[:160]}")
            r = await revoked.request(**req)
            if r.status_code != 401 or "revoked" not in r.text:
                wrong.append(f"revoked {method} {path}: {r.status_code} {r.text[:160]}")
    assert not wrong, "\n".join(wrong)
    await _untouched(tenants.http["a:user"], victim)


@pytest.mark.parametrize("how", ["spawn-wait", "shell"])
async def test_a_revoked_tokens_wait_and_shell_end_on_a_node(agents, tenants, how):
    async with tenants.sdk("root") as root:
        made = await root.projects.create_token_info(f"{tenants.name}/a", role="user")
        async with dsec.AsyncClient(agents.url, made.token) as c:
            sb = await c.create(memory_mb=64)
            if how == "shell":
                call = (await sb.shell()).run("sleep 613", timeout=700)
            else:
                proc = await sb.spawn("sleep 613")
                call = proc.wait()
            task = asyncio.ensure_future(call)
            await asyncio.sleep(1.0)
            await root.projects.revoke_token(made.id)
            with pytest.raises(dsec.Unauthorized, match="revoked"):
                await asyncio.wait_for(task, 15)
            if how == "shell":  # the command ends with its shell; a process goes on
                mine = await root.get(sb.id)
                for _ in range(50):
                    ps = await mine.exec("ps -o args | grep 'sleep 613' | grep -v grep")
                    if ps.stdout == "":
                        break
                    await asyncio.sleep(0.1)
                assert ps.stdout == ""


# ---- the node's own API ----

async def test_a_nodes_own_api_takes_the_cluster_credential_only(agents, tenants):
    node, url = next(iter(agents.nodes.items()))
    sb = await tenants.on_node("a:user", node)
    for token in (tenants.tokens["a:admin"], tenants.tokens["parent"], agents.token, "x"):
        async with httpx.AsyncClient(base_url=url, timeout=30, headers={
                "authorization": f"Bearer {token}", "x-dsec-project": ""}) as http:
            for method, path, body in (("GET", "/v1/sandboxes", None),
                                       ("POST", "/v1/sandboxes", {"memory_mb": 64}),
                                       ("GET", f"/v1/sandboxes/{sb}", None),
                                       ("POST", f"/v1/sandboxes/{sb}/exec", {"cmd": "true"}),
                                       ("GET", "/v1/jobs", None), ("GET", "/v1/images", None),
                                       ("GET", "/v1/nodes/load", None),
                                       ("GET", "/openapi.json", None)):
                r = await http.request(method, path, json=body)
                assert r.status_code == 401, (token[:8], method, path, r.text)
    # the cluster credential is the gateway's: it is told the project, and believed
    async with httpx.AsyncClient(base_url=url, timeout=30, headers={
            "authorization": f"Bearer {agents.cluster_token}"}) as http:
        b = {"x-dsec-project": f"{tenants.name}/b"}
        assert (await http.get(f"/v1/sandboxes/{sb}", headers=b)).status_code == 404
        a = {"x-dsec-project": f"{tenants.name}/a"}
        assert (await http.get(f"/v1/sandboxes/{sb}", headers=a)).status_code == 200


# ---- snapshots: made on one node, asked for on another ----

async def _snapshot_on(t: Tenants, who: str, node: str, tag: str, mark: bytes):
    """``who``'s pack_diff of a sandbox on ``node`` holding ``/mark``; its answer."""
    http = t.http[who]
    sb = await t.on_node(who, node)
    try:
        r = await http.put(f"/v1/sandboxes/{sb}/files", params={"path": "/mark"},
                           content=mark)
        assert r.status_code == 200, r.text
        return await http.post(f"/v1/sandboxes/{sb}/pack_diff", json={"tag": tag})
    finally:
        await http.delete(f"/v1/sandboxes/{sb}")


@pytest.fixture
async def tags(agents):
    made: list[str] = []
    yield made
    async with dsec.AsyncClient(agents.url, agents.token) as root:
        for tag in made:
            try:
                await root.remove_image(tag)
            except dsec.NotFound:
                pass


async def test_a_tag_on_one_node_is_not_taken_on_another(agents, tenants, tags):
    """A project once took a shared image's or a sibling's tag on a node that did not
    have it (each node checked only its own tags): a token above both then got either
    image by the node its create landed on."""
    x, y = _two(agents)
    shared, a_only = f"{tenants.name}/shared:v1", f"{tenants.name}/a-only:v1"
    tags += [shared, a_only]
    r = await _snapshot_on(tenants, "root", x, shared, b"root")
    assert r.status_code == 200 and r.json()["project"] is None, r.text
    r = await _snapshot_on(tenants, "a:user", x, a_only, b"a")
    assert r.status_code == 200 and r.json()["project"] == f"{tenants.name}/a", r.text
    for tag in (shared, a_only):  # node y has neither: each node keeps its own tags
        r = await _snapshot_on(tenants, "b:user", y, tag, b"b")
        assert r.status_code == 409 and "is taken" in r.text, (tag, r.text)
    listed = (await tenants.http["root"].get("/v1/images")).json()
    assert {i["name"]: i["project"] for i in listed if i["name"] in (shared, a_only)} == \
        {shared: None, a_only: f"{tenants.name}/a"}
    # its own project's snapshot a project replaces on any node
    r = await _snapshot_on(tenants, "a:user", y, a_only, b"a2")
    assert r.status_code == 200 and r.json()["project"] == f"{tenants.name}/a", r.text


async def test_a_snapshot_is_listed_to_its_project_whichever_node_holds_it(
        agents, tenants, tags):
    """The list once came from the first node alone: a snapshot on another one was in
    no list, not even its own project's."""
    tag = f"{tenants.name}/listed:v1"
    tags.append(tag)
    for node in _two(agents):
        r = await _snapshot_on(tenants, "a:user", node, tag, node.encode())
        assert r.status_code == 200, r.text
        for who in ("a:user", "parent", "root"):
            listed = (await tenants.http[who].get("/v1/images")).json()
            assert [i["project"] for i in listed if i["name"] == tag] == \
                [f"{tenants.name}/a"], (who, node)
        listed = (await tenants.http["b:user"].get("/v1/images")).json()
        assert tag not in [i["name"] for i in listed]
        async with tenants.sdk("root") as root:
            await root.remove_image(tag)


# ---- jobs, project delete, idempotency keys: spread over both nodes ----

async def test_a_job_on_both_nodes_is_its_projects_alone(agents, tenants):
    a, b, x, y = tenants.http["a:user"], tenants.http["b:user"], *_two(agents)
    job = f"run-{secrets.token_hex(3)}"
    mine = [await tenants.on_node("a:user", n, job=job) for n in (x, y)]
    theirs = [await tenants.on_node("b:user", n, job=job) for n in (x, y)]
    r = await a.post(f"/v1/jobs/{job}/heartbeat", json={"lease_s": 3600})
    assert r.status_code == 200 and r.json()["sandboxes"] == 2, r.text
    got = (await a.get(f"/v1/jobs/{job}")).json()
    assert got["sandboxes"] == 2 and got["lease_expires_at"] is not None
    listed = {j["job"]: j for j in (await b.get("/v1/jobs")).json()["jobs"]}
    assert listed[job]["sandboxes"] == 2 and listed[job]["lease_expires_at"] is None
    parent = {j["job"]: j for j in (await tenants.http["parent"].get("/v1/jobs")).json()["jobs"]}
    assert parent[job]["sandboxes"] == 4
    r = await b.post(f"/v1/jobs/{job}/pause")  # B's two, on both nodes; none of A's
    assert r.status_code == 200 and r.json()["sandboxes"] == 2, r.text
    for sb in mine:
        assert (await a.get(f"/v1/sandboxes/{sb}")).json()["state"] == "running"
    # B's lease lapsing at once, and B's stop, touch none of A's
    r = await b.post(f"/v1/jobs/{job}/heartbeat", json={"lease_s": 0.01, "stop_after_s": 0.01})
    assert r.status_code == 200 and r.json()["sandboxes"] == 2
    await asyncio.sleep(2.5)  # each node's reaper runs every second
    assert (await b.delete(f"/v1/jobs/{job}")).status_code == 204
    for sb in theirs:
        assert (await b.get(f"/v1/sandboxes/{sb}")).status_code != 200 or \
            (await b.get(f"/v1/sandboxes/{sb}")).json()["state"] != "running"
    for sb in mine:
        assert (await a.get(f"/v1/sandboxes/{sb}")).json()["state"] == "running"
    assert (await a.get(f"/v1/jobs/{job}")).json()["lease_expires_at"] is not None
    assert (await a.post(f"/v1/jobs/{job}/pause")).json()["sandboxes"] == 2
    assert (await a.delete(f"/v1/jobs/{job}")).status_code == 204  # on both nodes
    for sb in mine:
        r = await a.get(f"/v1/sandboxes/{sb}")
        assert r.status_code != 200 or r.json()["state"] != "running", r.text


async def test_a_project_is_not_deleted_while_a_node_holds_its_lease_or_snapshot(
        agents, tenants, tags):
    x, y = _two(agents)
    a = tenants.http["a:user"]
    path = f"{tenants.name}/a"
    job = f"run-{secrets.token_hex(3)}"
    sb = await tenants.on_node("a:user", y, job=job)
    assert (await a.post(f"/v1/jobs/{job}/heartbeat", json={"lease_s": 3600})).status_code == 200
    await a.delete(f"/v1/sandboxes/{sb}")  # the lease stays on node y
    root = tenants.http["root"]
    r = await root.delete("/v1/projects", params={"path": path})
    assert r.status_code == 409 and f"the job lease of {job!r}" in r.text, r.text
    assert (await a.delete(f"/v1/jobs/{job}")).status_code == 204
    tag = f"{tenants.name}/keep:v1"
    tags.append(tag)
    assert (await _snapshot_on(tenants, "a:user", y, tag, b"a")).status_code == 200
    r = await root.delete("/v1/projects", params={"path": path})
    assert r.status_code == 409 and f"the snapshot {tag!r}" in r.text, r.text
    r = await tenants.http["b:admin"].delete(f"/v1/images/{tag}")  # not B's to remove
    assert r.status_code == 404, r.text
    assert (await tenants.http["a:admin"].delete(f"/v1/images/{tag}")).status_code == 204
    assert (await root.delete("/v1/projects", params={"path": path})).status_code == 204


async def test_a_key_of_another_project_makes_its_own_sandboxes_on_any_node(
        agents, tenants):
    a, b = tenants.http["a:user"], tenants.http["b:user"]
    key = f"k-{secrets.token_hex(3)}"
    one = {}
    for who, http in (("a", a), ("b", b)):
        r = await http.post("/v1/sandboxes", json={"memory_mb": 64, "request_id": key})
        assert r.status_code == 201, r.text
        one[who] = r.json()
        assert one[who]["project"] == f"{tenants.name}/{who}"
    assert one["a"]["id"] != one["b"]["id"]
    many = {}
    for who, http in (("a", a), ("b", b)):
        r = await http.post("/v1/sandboxes/batch", json={
            "count": 4, "request_id": key + "-batch", "spec": {"memory_mb": 64}})
        assert r.status_code == 201 and not r.json()["errors"], r.text
        many[who] = {s["id"] for s in r.json()["sandboxes"]}
        assert {s["project"] for s in r.json()["sandboxes"]} == {f"{tenants.name}/{who}"}
    assert not many["a"] & many["b"]
    assert {agents.node_of(s) for s in many["a"] | many["b"]} == set(agents.nodes)
    for who, http in (("a", a), ("b", b)):  # a retry is each project's own
        r = await http.post("/v1/sandboxes", json={"memory_mb": 64, "request_id": key})
        assert r.json()["id"] == one[who]["id"]
        r = await http.post("/v1/sandboxes/batch", json={
            "count": 4, "request_id": key + "-batch", "spec": {"memory_mb": 64}})
        assert {s["id"] for s in r.json()["sandboxes"]} == many[who]
        listed = (await http.get("/v1/sandboxes", params={"request_id": key})).json()
        assert [s["id"] for s in listed["sandboxes"]] == [one[who]["id"]]


async def _healthy(http: httpx.AsyncClient, node: str, want: bool) -> None:
    for _ in range(150):
        nodes = {n["id"].removeprefix("node-"): n["healthy"]
                 for n in (await http.get("/v1/nodes")).json()}
        if nodes[node] is want:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"node {node} did not become healthy={want}")


async def test_a_project_is_not_deleted_while_a_node_does_not_answer(agents, tenants):
    import os
    import signal
    root, (here, node) = tenants.http["root"], _two(agents)
    sb = await tenants.on_node("a:user", here)
    os.kill(agents.pids[node], signal.SIGSTOP)  # it holds its port and answers nothing
    try:
        await _healthy(root, node, False)
        r = await root.delete("/v1/projects", params={"path": f"{tenants.name}/b"})
        assert r.status_code == 503 and node in r.text, r.text
        # it may hold the tag as another project's: a project's snapshot waits for it
        t0 = asyncio.get_running_loop().time()
        r = await tenants.http["a:user"].post(f"/v1/sandboxes/{sb}/pack_diff",
                                              json={"tag": f"{tenants.name}/new:v1"})
        assert r.status_code == 503 and node in r.text, r.text
        assert asyncio.get_running_loop().time() - t0 < 5  # a lost node is not waited for
    finally:
        os.kill(agents.pids[node], signal.SIGCONT)
    await _healthy(root, node, True)
    r = await root.delete("/v1/projects", params={"path": f"{tenants.name}/b"})
    assert r.status_code == 204, r.text


async def test_another_projects_snapshot_is_a_missing_tag_on_every_node(agents, tenants, tags):
    tag, gone = f"{tenants.name}/a-snap:v1", f"{tenants.name}/none:v1"
    tags.append(tag)
    assert (await _snapshot_on(tenants, "a:user", _two(agents)[0], tag, b"a")
            ).status_code == 200
    b = tenants.http["b:user"]
    for _ in range(4):  # wherever the create lands
        for body in ({"image": tag}, {"layers": [tag]}):
            got = await b.post("/v1/sandboxes", json={"memory_mb": 64, **body})
            want = await b.post("/v1/sandboxes", json={"memory_mb": 64, **{
                k: (gone if isinstance(v, str) else [gone]) for k, v in body.items()}})
            assert got.status_code == 404 and \
                _shape(got, tag) == _shape(want, gone), (got.text, want.text)
    # nor does a header at the gateway change whose request it is
    r = await b.get("/v1/images", headers={"x-dsec-project": f"{tenants.name}/a"})
    assert tag not in r.text
    r = await b.post("/v1/sandboxes", headers={"x-dsec-project": f"{tenants.name}/a"},
                     json={"memory_mb": 64, "image": tag})
    assert r.status_code == 404, r.text


async def test_a_snapshot_is_used_whichever_node_a_create_is_placed_on(agents, tenants, tags):
    """Each node keeps the snapshots it made; a create placed on the other node once
    answered NotFound (about half of them, with two nodes)."""
    x, _ = _two(agents)
    tag = f"{tenants.name}/a-here:v1"
    tags.append(tag)
    assert (await _snapshot_on(tenants, "a:user", x, tag, b"a")).status_code == 200
    for who in ("a:user", "parent"):
        http = tenants.http[who]
        for i in range(5):
            for key in (None, f"snap-{secrets.token_hex(3)}"):
                r = await http.post("/v1/sandboxes", json={"memory_mb": 64, "image": tag,
                                                           "request_id": key})
                assert r.status_code == 201, (who, i, r.text)
                sb = r.json()["id"]
                assert agents.node_of(sb) == x
                if key is not None:  # a retry finds it on the same way
                    again = await http.post("/v1/sandboxes", json={
                        "memory_mb": 64, "image": tag, "request_id": key})
                    assert again.json()["id"] == sb
                await http.delete(f"/v1/sandboxes/{sb}")
