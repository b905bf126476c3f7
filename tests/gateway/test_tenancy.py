"""Multi-tenancy against the real server: a token of one project neither reaches nor
learns of another project's sandboxes, shells, processes, jobs, images and tokens, and a
role does no more than it may.

Layout: ``<name>`` (a parent) with two children ``<name>/a`` and ``<name>/b``. Another
project's object answers exactly what a missing one does (status and body, up to the id).
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets

import httpx
import pytest

import dsec
from dsec.integrations.e2b.auth import sign_v1


@pytest.fixture
def name() -> str:
    return f"t{secrets.token_hex(4)}"


class Tenants:
    """Tokens of the parent and of both children, and raw HTTP clients with them."""

    def __init__(self, url: str, name: str, tokens: dict[str, str]) -> None:
        self.url, self.name, self.tokens = url, name, tokens
        self.http = {k: httpx.AsyncClient(base_url=url, timeout=60,
                                          headers={"authorization": f"Bearer {t}"})
                     for k, t in tokens.items()}

    def sdk(self, key: str) -> dsec.AsyncClient:
        return dsec.AsyncClient(self.url, self.tokens[key])

    async def close(self) -> None:
        for h in self.http.values():
            await h.aclose()


@pytest.fixture
async def tenants(client, name):
    await client.projects.create(name)
    for child in ("a", "b"):
        await client.projects.create(f"{name}/{child}")
    tokens = {"parent": await client.projects.create_token(name, role="user")}
    for child in ("a", "b"):
        for role in ("viewer", "user", "admin"):
            tokens[f"{child}:{role}"] = await client.projects.create_token(
                f"{name}/{child}", role=role)
    t = Tenants(client.url, name, tokens)
    try:
        yield t
    finally:
        await t.close()
        async with t.sdk("parent") as c:  # the parent's token reaches both children
            await c.stop_all()


def _missing(sb_id: str) -> str:
    """An id on the same node that names no sandbox."""
    return sb_id[:-12] + secrets.token_hex(6)


def _shape(r: httpx.Response, *ids: str) -> tuple[int, str]:
    """Status and body with the ids asked about blanked: what may differ between two
    answers that must say the same."""
    body = r.text
    for i in ids:
        body = body.replace(i, "ID")
    return r.status_code, body


async def _wait_ended(http: httpx.AsyncClient, sb_id: str, timeout: float = 15.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end:
        if (await http.get(f"/v1/sandboxes/{sb_id}")).status_code != 200:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"{sb_id} did not end within {timeout}s")


# ---- jobs ----

async def test_another_projects_job_lease_is_not_listed(tenants):
    a, b = tenants.http["a:user"], tenants.http["b:user"]
    job = f"run-{secrets.token_hex(3)}"
    r = await a.post("/v1/sandboxes", json={"memory_mb": 64, "job": job})
    assert r.status_code == 201, r.text
    assert (await a.post(f"/v1/jobs/{job}/heartbeat", json={"lease_s": 3600})).status_code == 200
    assert job not in [j["job"] for j in (await b.get("/v1/jobs")).json()["jobs"]]
    gone = f"run-{secrets.token_hex(3)}"
    assert _shape(await b.get(f"/v1/jobs/{job}"), job) == \
        _shape(await b.get(f"/v1/jobs/{gone}"), gone)
    # the parent sees its children's jobs and their leases
    parent = (await tenants.http["parent"].get(f"/v1/jobs/{job}")).json()
    assert parent["sandboxes"] == 1 and parent["lease_expires_at"] is not None


async def test_another_projects_heartbeat_neither_stops_nor_unleases_a_job(tenants):
    a, b = tenants.http["a:user"], tenants.http["b:user"]
    job = f"run-{secrets.token_hex(3)}"
    sb = (await a.post("/v1/sandboxes", json={"memory_mb": 64, "job": job})).json()["id"]
    lease = (await a.post(f"/v1/jobs/{job}/heartbeat", json={"lease_s": 3600})).json()
    # B's lease of the same name lapses at once and asks for a stop right after
    r = await b.post(f"/v1/jobs/{job}/heartbeat", json={"lease_s": 0.01, "stop_after_s": 0.01})
    assert r.status_code == 200 and r.json()["sandboxes"] == 0
    await asyncio.sleep(2.5)  # the reaper runs every second
    got = await a.get(f"/v1/sandboxes/{sb}")
    assert got.status_code == 200 and got.json()["state"] == "running", got.text
    assert (await b.delete(f"/v1/jobs/{job}")).status_code == 204  # stops none of A's
    assert (await a.get(f"/v1/sandboxes/{sb}")).status_code == 200
    mine = (await a.get(f"/v1/jobs/{job}")).json()
    assert mine["lease_expires_at"] == pytest.approx(lease["lease_expires_at"])


# ---- sandboxes, shells ----

async def test_another_projects_shell_is_not_found_and_stays_open(tenants):
    a, b = tenants.http["a:user"], tenants.http["b:user"]
    sb = (await a.post("/v1/sandboxes", json={"memory_mb": 64})).json()["id"]
    sh = (await a.post(f"/v1/sandboxes/{sb}/shells")).json()["id"]
    other = "sh-" + secrets.token_hex(6)
    for method, tail, body in (("DELETE", "", None), ("POST", "/run", {"cmd": "true"})):
        got = await b.request(method, f"/v1/sandboxes/{sb}/shells/{sh}{tail}", json=body)
        gone = _missing(sb)
        want = await b.request(method, f"/v1/sandboxes/{gone}/shells/{other}{tail}",
                               json=body)
        assert got.status_code == 404, got.text
        assert _shape(got, sb, sh) == _shape(want, gone, other)
    r = await a.post(f"/v1/sandboxes/{sb}/shells/{sh}/run", json={"cmd": "echo still"})
    assert r.status_code == 200 and r.json()["stdout"] == "still\n", r.text


async def test_another_projects_ended_sandbox_answers_as_a_missing_one(tenants):
    a, b = tenants.http["a:user"], tenants.http["b:user"]
    sb = (await a.post("/v1/sandboxes", json={"memory_mb": 64, "ttl_s": 1})).json()["id"]
    await _wait_ended(a, sb)
    assert (await a.get(f"/v1/sandboxes/{sb}")).json()["error"]["code"] == "stopped"
    gone = _missing(sb)
    for method, tail, body in (("GET", "", None), ("DELETE", "", None),
                               ("POST", "/exec", {"cmd": "true"}),
                               ("GET", "/trajectory", None), ("GET", "/processes", None)):
        got = await b.request(method, f"/v1/sandboxes/{sb}{tail}", json=body)
        want = await b.request(method, f"/v1/sandboxes/{gone}{tail}", json=body)
        assert _shape(got, sb) == _shape(want, gone), (method, tail)
    # its own project (and the parent) still hear why it ended
    r = await tenants.http["parent"].get(f"/v1/sandboxes/{sb}")
    assert r.json()["error"]["code"] == "stopped"


# ---- every sandbox route of the OpenAPI document ----

BODIES = {  # a valid body of each request model a sandbox route takes
    "ExecRequest": {"cmd": "true"}, "ShellRunRequest": {"cmd": "true"},
    "PackDiffRequest": {"tag": "tenancy/probe:v1"}, "InputRequest": {"text": "a"},
    "NetworkRequest": {"allow": {}}, "TimeoutRequest": {"timeout_s": 600},
    "ProcessRequest": {"cmd": "true"}, "ProcessWaitRequest": {"timeout": 0},
    "SignalRequest": {"signal": 28}, "StdinRequest": {"data": ""},
    "PtySize": {"rows": 24, "cols": 80},
}


def _sandbox_routes(doc: dict) -> list[tuple[str, str, dict]]:
    """(method, path, operation) of every route naming a sandbox; stops last."""
    out = [(m.upper(), p, op) for p, ops in doc["paths"].items() if "{sb_id}" in p
           for m, op in ops.items()]
    assert len(out) >= 30, [p for _, p, _ in out]  # the document lists them all
    return sorted(out, key=lambda r: (r[0] == "DELETE" and r[1] == "/v1/sandboxes/{sb_id}"))


def _call(method: str, path: str, op: dict, ids: dict[str, str]) -> dict:
    """The request ``op`` takes, with ``ids`` in its path."""
    kw: dict = {"params": {q["name"]: "/tmp" for q in op.get("parameters", [])
                           if q["in"] == "query" and q.get("required")}}
    body = op.get("requestBody", {}).get("content", {})
    if "application/json" in body:
        model = body["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
        assert model in BODIES, f"{method} {path}: add a valid {model} to BODIES"
        kw["json"] = BODIES[model]
    elif method == "PUT":
        kw["content"] = b""
    for k, v in ids.items():
        path = path.replace("{" + k + "}", v)
    return {"method": method, "url": path, **kw}


@pytest.fixture
async def victim(tenants):
    """A's sandbox with an open shell and a running background process."""
    a = tenants.http["a:user"]
    sb = (await a.post("/v1/sandboxes", json={"memory_mb": 64})).json()["id"]
    sh = (await a.post(f"/v1/sandboxes/{sb}/shells")).json()["id"]
    pid = (await a.post(f"/v1/sandboxes/{sb}/processes",
                        json={"cmd": "sleep 600", "stdin_open": True})).json()["pid"]
    return {"sb_id": sb, "sh_id": sh, "pid": str(pid)}


async def _untouched(a: httpx.AsyncClient, v: dict) -> None:
    sb = v["sb_id"]
    assert (await a.get(f"/v1/sandboxes/{sb}")).json()["state"] == "running"
    r = await a.post(f"/v1/sandboxes/{sb}/shells/{v['sh_id']}/run", json={"cmd": "echo ok"})
    assert r.json()["stdout"] == "ok\n", r.text
    assert (await a.get(f"/v1/sandboxes/{sb}/processes/{v['pid']}")).json()["running"]


async def test_every_sandbox_route_answers_another_project_as_a_missing_id(
        tenants, victim, server):
    async with httpx.AsyncClient(base_url=server.url,
                                 headers={"authorization": f"Bearer {server.token}"}) as root:
        doc = (await root.get("/openapi.json")).json()
    parent = tenants.http["parent"]
    theirs = (await parent.post("/v1/sandboxes", json={"memory_mb": 64})).json()["id"]
    gone = {"sb_id": _missing(victim["sb_id"]), "sh_id": "sh-" + secrets.token_hex(6),
            "pid": victim["pid"]}
    pairs = [("b:user", victim),  # a sibling's
             ("a:user", {**victim, "sb_id": theirs})]  # the parent's, to a child
    wrong = []
    for method, path, op in _sandbox_routes(doc):
        for who, ids in pairs:
            http = tenants.http[who]
            got = await http.request(**_call(method, path, op, ids))
            want = await http.request(**_call(method, path, op, gone))
            if got.status_code != 404 or _shape(got, *ids.values()) != \
                    _shape(want, *gone.values()):
                wrong.append(f"{who} {method} {path}: {got.status_code} {got.text[:160]} "
                             f"(a missing id: {want.status_code} {want.text[:160]})")
    assert not wrong, "\n".join(wrong)
    await _untouched(tenants.http["a:user"], victim)
    assert (await parent.get(f"/v1/sandboxes/{victim['sb_id']}")).status_code == 200


async def test_a_viewer_may_change_nothing_and_a_revoked_token_reach_nothing(
        tenants, victim, server, client):
    async with httpx.AsyncClient(base_url=server.url,
                                 headers={"authorization": f"Bearer {server.token}"}) as root:
        doc = (await root.get("/openapi.json")).json()
    viewer = tenants.http["a:viewer"]
    made = await client.projects.create_token_info(f"{tenants.name}/a", role="admin")
    await client.projects.revoke_token(made.id)
    revoked = httpx.AsyncClient(base_url=server.url,
                                headers={"authorization": f"Bearer {made.token}"})
    wrong = []
    async with revoked:
        for method, path, op in _sandbox_routes(doc):
            req = _call(method, path, op, victim)
            if method not in ("GET", "HEAD"):
                r = await viewer.request(**req)
                if r.status_code != 403:
                    wrong.append(f"viewer {method} {path}: {r.status_code} {r.text[:160]}")
            r = await revoked.request(**req)
            if r.status_code != 401 or "revoked" not in r.text:
                wrong.append(f"revoked {method} {path}: {r.status_code} {r.text[:160]}")
    assert not wrong, "\n".join(wrong)
    await _untouched(tenants.http["a:user"], victim)


# ---- revocation of a running stream ----

async def _ends_unauthorized(aiter_once, what: str) -> None:
    try:
        await asyncio.wait_for(aiter_once(), 15)
    except dsec.Unauthorized:
        return
    except asyncio.TimeoutError:
        raise AssertionError(f"{what} went on 15 s after its token was revoked") from None
    raise AssertionError(f"{what} ended without Unauthorized after its token was revoked")


async def test_a_revoked_token_ends_its_terminal_and_its_process_follow(tenants, client):
    made = await client.projects.create_token_info(f"{tenants.name}/a", role="user")
    async with dsec.AsyncClient(client.url, made.token) as c:
        sb = await c.create(memory_mb=64)
        proc = await sb.spawn("echo started; sleep 60; echo never")
        pty = await sb.pty()
        events = proc.stream()
        assert "started" in (await events.__anext__()).data
        await pty.write("echo hi\n")
        await pty.read(10)
        await client.projects.revoke_token(made.id)

        async def follow():
            async for ev in events:
                assert "never" not in ev.data

        async def terminal():
            while await pty.read():
                pass

        await _ends_unauthorized(follow, "a process follow")
        await _ends_unauthorized(terminal, "a terminal")


# ---- listings, metrics, tokens, idempotency keys ----

async def test_metrics_show_only_the_callers_projects(tenants, server):
    r = await tenants.http["a:user"].post("/v1/sandboxes", json={"memory_mb": 64})
    assert r.status_code == 201
    labelled = re.compile(r'project="([^"]*)"')

    async def projects_in(http) -> set[str]:
        text = (await http.get("/metrics")).text
        assert "dsec_gateway_requests_total" in text  # the rest is still there
        return set(labelled.findall(text))

    a_path = f"{tenants.name}/a"
    assert await projects_in(tenants.http["b:viewer"]) <= {f"{tenants.name}/b"}
    assert await projects_in(tenants.http["parent"]) == {a_path}
    async with httpx.AsyncClient(base_url=server.url,
                                 headers={"authorization": f"Bearer {server.token}"}) as root:
        assert a_path in await projects_in(root)


async def test_another_projects_token_is_revoked_or_found_by_no_one(tenants, client):
    a_tok = await client.projects.create_token_info(f"{tenants.name}/a", role="user")
    b_admin = tenants.http["b:admin"]
    missing = await b_admin.post("/v1/projects/tokens/revoke",
                                 json={"token": "tok-" + secrets.token_hex(6)})
    by_id = await b_admin.post("/v1/projects/tokens/revoke", json={"token": a_tok.id})
    by_secret = await b_admin.post("/v1/projects/tokens/revoke", json={"token": a_tok.token})
    assert by_id.status_code == by_secret.status_code == missing.status_code == 404
    assert tenants.name not in by_id.text + by_secret.text  # nor whose it is
    async with dsec.AsyncClient(client.url, a_tok.token) as a:
        await a.list()  # still works
    # a secret given to revoke is never written to the audit log, not even in part
    audit = await client.projects.audit(tenants.name, limit=1000)
    assert not [e for e in audit if a_tok.token[:12] in e.target + e.outcome]
    await client.projects.revoke_token(a_tok.token)
    audit = await client.projects.audit("", limit=1000)
    assert not [e for e in audit if a_tok.token[:12] in e.target + e.outcome]


async def test_a_batch_key_of_another_project_makes_new_sandboxes(tenants):
    parent = tenants.http["parent"]
    key = f"batch-{secrets.token_hex(3)}"
    made = {}
    for child in ("a", "b"):
        r = await parent.post("/v1/sandboxes/batch", json={
            "count": 1, "request_id": key,
            "spec": {"memory_mb": 64, "project": f"{tenants.name}/{child}"}})
        assert r.status_code == 201 and not r.json()["errors"], r.text
        (made[child],) = r.json()["sandboxes"]
    assert made["b"]["project"] == f"{tenants.name}/b"
    assert made["a"]["id"] != made["b"]["id"]
    again = await parent.post("/v1/sandboxes/batch", json={
        "count": 1, "request_id": key,
        "spec": {"memory_mb": 64, "project": f"{tenants.name}/b"}})
    assert [s["id"] for s in again.json()["sandboxes"]] == [made["b"]["id"]]  # a retry


# ---- images made by pack_diff ----

@pytest.fixture
async def tags(client):
    """Image tags a test makes; the root token removes them afterwards."""
    made: list[str] = []
    yield made
    for tag in made:
        try:
            await client.remove_image(tag)
        except dsec.NotFound:
            pass


async def _snapshot(c: dsec.AsyncClient, tag: str, mark: bytes) -> None:
    sb = await c.create(memory_mb=64)
    try:
        await sb.files.write("/mark", mark)
        await sb.pack_diff(tag)
    finally:
        await sb.stop()


async def _mark_of(c: dsec.AsyncClient, image: str) -> bytes:
    sb = await c.create(memory_mb=64, image=image)
    try:
        return await sb.files.read("/mark")
    finally:
        await sb.stop()


async def test_a_projects_pack_diff_replaces_no_shared_image(tenants, client, tags):
    tag = f"{tenants.name}/shared:v1"
    tags.append(tag)
    await _snapshot(client, tag, b"root")  # the root token's snapshot is shared
    async with tenants.sdk("b:user") as b:
        with pytest.raises(dsec.Conflict, match="tag"):
            await _snapshot(b, tag, b"b")
        assert await _mark_of(b, tag) == b"root"  # B may use it, not change it
    assert await _mark_of(client, tag) == b"root"


async def test_a_projects_snapshot_is_seen_only_in_its_project_and_above(tenants, tags):
    tag, gone = f"{tenants.name}/a-only:v1", f"{tenants.name}/none:v1"
    tags.append(tag)
    async with tenants.sdk("a:user") as a:
        await _snapshot(a, tag, b"a")
        assert tag in [i.name for i in await a.images()]
        assert await _mark_of(a, tag) == b"a"
    async with tenants.sdk("parent") as p:
        assert tag in [i.name for i in await p.images()]
        assert await _mark_of(p, tag) == b"a"
    b = tenants.http["b:user"]
    assert tag not in [i["name"] for i in (await b.get("/v1/images")).json()]
    for ask in (lambda image: b.post("/v1/sandboxes", json={"memory_mb": 64, "image": image}),
                lambda image: b.post("/v1/sandboxes", json={"memory_mb": 64,
                                                            "layers": [image]}),
                lambda image: b.get(f"/v1/manifests/{image}")):
        got, want = await ask(tag), await ask(gone)
        assert _shape(got, tag) == _shape(want, gone)
        assert got.status_code == 404
        assert tag not in got.text.partition("known:")[2]  # nor listed as a known one
    async with tenants.sdk("b:user") as bc:  # its name is not B's to take either
        with pytest.raises(dsec.Conflict, match="tag"):
            await _snapshot(bc, tag, b"b")
    async with tenants.sdk("a:user") as a:
        assert await _mark_of(a, tag) == b"a"


# ---- routes outside the OpenAPI document: the terminal, E2B's control plane ----

async def _pty_answer(url: str, token: str, sb_id: str) -> str:
    from websockets.asyncio.client import connect
    ws_url = url.replace("http://", "ws://") + f"/v1/sandboxes/{sb_id}/pty"
    async with connect(ws_url, additional_headers={"authorization": f"Bearer {token}"}) as ws:
        return await asyncio.wait_for(ws.recv(), 10)


async def test_the_terminal_and_e2b_calls_answer_another_project_as_a_missing_id(
        tenants, victim):
    sb, gone = victim["sb_id"], _missing(victim["sb_id"])
    token = tenants.tokens["b:user"]
    answer = await _pty_answer(tenants.url, token, sb)
    assert json.loads(answer)["error"]["code"] == "not_found"
    assert answer.replace(sb, "ID") == \
        (await _pty_answer(tenants.url, token, gone)).replace(gone, "ID")
    async with httpx.AsyncClient(base_url=tenants.url + "/e2b", timeout=60,
                                 headers={"x-api-key": token}) as e2b:
        for method, tail, body in (("GET", "", None), ("POST", "/connect", {"timeout": 60}),
                                   ("POST", "/resume", {"timeout": 60}),
                                   ("POST", "/timeout", {"timeout": 60}),
                                   ("POST", "/pause", None), ("DELETE", "", None)):
            got = await e2b.request(method, f"/sandboxes/{sb}{tail}", json=body)
            want = await e2b.request(method, f"/sandboxes/{gone}{tail}", json=body)
            assert got.status_code == 404 and _shape(got, sb) == _shape(want, gone), \
                (method, tail, got.text)
        listed = (await e2b.get("/sandboxes")).json()
        assert sb not in [s["sandboxID"] for s in listed]
    await _untouched(tenants.http["a:user"], victim)


async def test_listings_and_their_filters_show_only_the_callers_sandboxes(tenants):
    a, b = tenants.http["a:user"], tenants.http["b:user"]
    job, key = f"run-{secrets.token_hex(3)}", f"key-{secrets.token_hex(3)}"
    r = await a.post("/v1/sandboxes", json={"memory_mb": 64, "job": job, "request_id": key,
                                            "labels": {"secret": "yes"}})
    sb = r.json()["id"]
    for params in ({}, {"job": job}, {"request_id": key}, {"label": "secret=yes"}):
        listed = (await b.get("/v1/sandboxes", params=params)).json()["sandboxes"]
        assert listed == [], params
        assert [s["id"] for s in (await tenants.http["parent"].get(
            "/v1/sandboxes", params=params)).json()["sandboxes"]] == [sb], params
    assert job not in (await b.get("/v1/jobs")).text
    assert sb not in (await b.get("/v1/nodes")).text + (await b.get("/healthz")).text
    # a create with A's request_id in B makes B's own sandbox, not A's back
    mine = (await b.post("/v1/sandboxes", json={"memory_mb": 64, "job": job,
                                                "request_id": key})).json()
    assert mine["id"] != sb and mine["project"] == f"{tenants.name}/b"


async def test_a_revoked_tokens_e2b_access_token_stops_working(tenants, client):
    made = await client.projects.create_token_info(f"{tenants.name}/a", role="user")
    async with httpx.AsyncClient(base_url=tenants.url, timeout=60) as h:
        r = await h.post("/e2b/sandboxes", json={"templateID": "busybox"},
                         headers={"x-api-key": made.token})
        assert r.status_code == 201, r.text
        sb, access = r.json()["sandboxID"], r.json()["envdAccessToken"]

        async def envd(token: str) -> httpx.Response:
            return await h.post("/e2b/envd/process.Process/List", json={},
                                headers={"e2b-sandbox-id": sb, "x-access-token": token})

        async def signed_read(token: str) -> httpx.Response:  # a download_url's call
            sig = sign_v1("/etc/hostname", "read", "", token, None)
            return await h.get("/files", params={"path": "/etc/hostname", "signature": sig})

        assert (await envd(access)).status_code == 200
        assert (await signed_read(access)).status_code == 200
        await client.projects.revoke_token(made.id)
        r = await envd(access)
        assert r.status_code == 401 and r.json()["code"] == "unauthenticated", r.text
        assert (await signed_read(access)).status_code == 401
        # a valid token of the project connects again and gets a working one
        r = await h.post(f"/e2b/sandboxes/{sb}/connect", json={},
                         headers={"x-api-key": tenants.tokens["a:user"]})
        assert (await envd(r.json()["envdAccessToken"])).status_code == 200
