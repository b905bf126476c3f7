"""Projects, quotas, scoped tokens and queued admission against the real server."""

from __future__ import annotations

import asyncio
import secrets

import httpx
import pytest

import dsec


@pytest.fixture
def name() -> str:
    """A fresh top-level project name (the session's server is shared)."""
    return f"t{secrets.token_hex(4)}"


@pytest.fixture
async def team(client, name):
    """A project with a small quota and a user token for it; emptied afterwards."""
    await client.projects.create(name, quota=dsec.Quota(sandboxes=2, cpu=4, memory_mb=4096))
    token = await client.projects.create_token(name, role="user", ttl_s=3600)
    async with dsec.AsyncClient(client.url, token) as c:
        yield name, token, c
        await c.stop_all()


def _raw(server, token: str) -> httpx.Client:
    return httpx.Client(base_url=server.url, timeout=60,
                        headers={"authorization": f"Bearer {token}"})


async def test_nested_projects_and_the_tokens_view(client, name):
    await client.projects.create(name, quota=dsec.Quota(sandboxes=100, cpu=10))
    await client.projects.create(f"{name}/run-17", quota=dsec.Quota(sandboxes=60))
    await client.projects.create(f"{name}/run-17/eval")
    admin = await client.projects.create_token(f"{name}/run-17", role="admin")
    async with dsec.AsyncClient(client.url, admin) as c:
        paths = [p.path for p in await c.projects.list()]
        assert paths == [f"{name}/run-17", f"{name}/run-17/eval"]
        with pytest.raises(dsec.Forbidden, match="not at or below"):
            await c.projects.get(name)
        with pytest.raises(dsec.Forbidden, match="below"):  # its own quota is its parent's
            await c.projects.set_quota(f"{name}/run-17", dsec.Quota(sandboxes=1000))
    info = await client.projects.get(name)
    assert info.given.sandboxes == 60 and info.quota.cpu == 10


async def test_a_child_never_gets_more_than_its_parent_has_left(client, name):
    await client.projects.create(name, quota=dsec.Quota(sandboxes=10, memory_mb=1000))
    await client.projects.create(f"{name}/a", quota=dsec.Quota(sandboxes=7))
    with pytest.raises(dsec.InvalidArgument, match="has 3 of its 10 not given.*at most 3"):
        await client.projects.create(f"{name}/b", quota=dsec.Quota(sandboxes=4))
    await client.projects.create(f"{name}/b", quota=dsec.Quota(sandboxes=3))
    with pytest.raises(dsec.InvalidArgument, match="sub-projects were given 10"):
        await client.projects.set_quota(name, dsec.Quota(sandboxes=9))
    assert [p.path for p in await client.projects.list() if p.path.startswith(name)] == \
        [name, f"{name}/a", f"{name}/b"]


@pytest.mark.parametrize("path,why", [
    ("a/../b", "contains '..'"),
    ("a//b", "empty segment"),
    ("/a", "empty segment"),
    ("/".join(["x"] * 300), "levels deep"),
    ("a b", "letters, digits"),
])
def test_bad_project_paths_are_400_naming_the_problem(server, path, why):
    with _raw(server, server.token) as http:
        r = http.post("/v1/projects", json={"path": path})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_argument"
    assert why in r.json()["error"]["message"]


@pytest.mark.parametrize("quota,why", [
    ({"sandboxes": -1}, "greater than or equal to 0"),
    ({"memory_mb": 2**70}, "less than or equal to"),
    ({"cpu": 1e300}, "less than or equal to"),
    ({"creations_per_s": "NaN"}, "finite"),
])
def test_quota_arithmetic_out_of_range_is_400(server, name, quota, why):
    with _raw(server, server.token) as http:
        r = http.post("/v1/projects", json={"path": name, "quota": quota})
        assert r.status_code == 400, r.text
        assert why in r.json()["error"]["message"]
        assert http.get("/v1/projects/info", params={"path": name}).status_code == 404


async def test_roles(client, name, server):
    await client.projects.create(name)
    viewer = await client.projects.create_token(name, role="viewer")
    user = await client.projects.create_token(name, role="user")
    async with dsec.AsyncClient(client.url, viewer) as v, dsec.AsyncClient(client.url, user) as u:
        assert await v.list() == []
        with pytest.raises(dsec.Forbidden, match="viewer token .* needs user"):
            await v.create(memory_mb=64)
        with pytest.raises(dsec.Forbidden, match="needs admin"):
            await u.projects.create(f"{name}/sub")
        with pytest.raises(dsec.Forbidden, match="needs admin"):
            await u.projects.create_token(name)
        with pytest.raises(dsec.Forbidden, match="needs admin"):
            await u.remove_image("busybox")
        with pytest.raises(dsec.Forbidden, match="root-admin"):  # images are shared
            await u._request("PUT", "/v1/manifests/busybox:latest", content=b"{}")
        sb = await u.create(memory_mb=64)
        try:
            assert sb.info.project == name
            assert [i.id for i in await v.list()] == [sb.id]
        finally:
            await sb.stop()


async def test_another_projects_sandbox_is_not_found(client, team, name, sandbox):
    _, _, c = team
    mine = await c.create(memory_mb=64)
    for call in (c.get(sandbox.id), c._request("POST", f"/v1/sandboxes/{sandbox.id}/exec",
                                                json={"cmd": "true"}),
                 c._request("DELETE", f"/v1/sandboxes/{sandbox.id}")):
        with pytest.raises(dsec.NotFound, match=f"sandbox {sandbox.id} not found"):
            await call
    assert [i.id for i in await c.list()] == [mine.id]
    assert (await sandbox.exec("true")).exit_code == 0  # untouched
    ids = {i.id for i in await client.list()}  # the root sees every project
    assert {mine.id, sandbox.id} <= ids


async def test_quota_refuses_at_once_or_waits_in_line(team, server):
    name, token, c = team
    a = await c.create(memory_mb=64)
    await c.create(memory_mb=64)
    with pytest.raises(dsec.QuotaExceeded, match="holds 2 of its quota.sandboxes 2"):
        await c.create(memory_mb=64)
    with _raw(server, token) as http:
        r = http.post("/v1/sandboxes", json={"memory_mb": 64})
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["code"] == "quota_exceeded"

    async def stop_later():
        await asyncio.sleep(1.0)
        await a.stop()
    waiting = asyncio.create_task(c.create(memory_mb=64, wait_s=30))
    await stop_later()
    third = await waiting
    assert third.info.state == "running"
    usage = await c.projects.usage(name)
    assert usage.sandboxes == 2 and usage.memory_mb == 128


async def test_batch_items_each_get_the_quota(team):
    name, _, c = team
    made = await c.create_many(3, memory_mb=64)
    assert len(made) == 2
    with pytest.raises(dsec.QuotaExceeded):
        await c.create_many(2, memory_mb=64)


async def test_a_job_stop_gives_the_quota_back_at_once(team):
    """As a sandbox's own stop does: not at the next reconcile (seconds later), which
    refused creates meanwhile, and a project delete, that the quota still counted."""
    name, _, c = team
    await c.create(memory_mb=64, job="jx")
    await c.create(memory_mb=64, job="jx")
    await c.jobs.stop("jx")
    assert (await c.projects.usage(name)).sandboxes == 0
    made = await c.create_many(2, memory_mb=64)  # the whole quota again, at once
    assert len(made) == 2


async def test_usage_rolls_up(client, name):
    await client.projects.create(name, quota=dsec.Quota(sandboxes=5))
    await client.projects.create(f"{name}/a")
    tok = await client.projects.create_token(f"{name}/a")
    async with dsec.AsyncClient(client.url, tok) as c:
        await c.create(memory_mb=64, cpu=0.5)
        try:
            up = await client.projects.usage(name)
            assert (up.sandboxes, up.cpu, up.memory_mb) == (1, 0.5, 64)
            with pytest.raises(dsec.Conflict, match="holds 1 sandbox;"):
                await client.projects.delete(f"{name}/a")
        finally:
            await c.stop_all()
    assert (await client.projects.usage(name)).sandboxes == 0


async def test_revoked_expired_and_orphaned_tokens(client, name):
    await client.projects.create(name)
    made = await client.projects.create_token_info(name, ttl_s=3600)
    short = await client.projects.create_token(name, ttl_s=1)
    async with dsec.AsyncClient(client.url, made.token) as c:
        assert await c.list() == []
        await client.projects.revoke_token(made.id)
        with pytest.raises(dsec.Unauthorized, match=f"token {made.id} was revoked"):
            await c.list()
    await asyncio.sleep(1.2)
    async with dsec.AsyncClient(client.url, short) as c:
        with pytest.raises(dsec.Unauthorized, match="expired"):
            await c.list()
    doomed = await client.projects.create_token(name)
    await client.projects.delete(name)
    await client.projects.create(name)  # the same path again is another project
    async with dsec.AsyncClient(client.url, doomed) as c:
        with pytest.raises(dsec.Unauthorized, match="project that was deleted"):
            await c.list()
    assert all(t.id != made.id for t in await client.projects.tokens(name))


async def test_a_revoked_token_ends_its_running_exec_stream(client, name):
    await client.projects.create(name)
    made = await client.projects.create_token_info(name)
    async with dsec.AsyncClient(client.url, made.token) as c:
        sb = await c.create(memory_mb=64)
        try:
            seen = []
            with pytest.raises(dsec.Unauthorized, match="revoked"):
                async for ev in sb.exec_stream("echo started; sleep 60; echo never"):
                    seen.append(ev.data)
                    if "started" in ev.data:
                        await client.projects.revoke_token(made.token)
            assert "never" not in "".join(seen)
        finally:
            await (await client.get(sb.id)).stop()


async def test_audit_records_management_and_refusals(client, name, server):
    await client.projects.create(name)
    viewer = await client.projects.create_token(name, role="viewer")
    async with dsec.AsyncClient(client.url, viewer) as v:
        with pytest.raises(dsec.Forbidden):
            await v.create(memory_mb=64)
    entries = await client.projects.audit(name)
    outcomes = [(e.action, e.outcome.split(":")[0]) for e in entries]
    assert ("POST /v1/sandboxes", "forbidden") in outcomes
    assert ("POST /v1/projects/tokens", "ok") in outcomes
    assert all(e.project.startswith(name) for e in entries)
    root_view = await client.projects.audit("", limit=1000)
    assert any(e.action == "POST /v1/projects" and e.project == name for e in root_view)


async def test_projects_and_ownership_survive_a_server_crash(tmp_path):
    from tests.support.server import ServerProcess
    (tmp_path / "state").mkdir()
    srv = ServerProcess(state_dir=tmp_path / "state").start()
    try:
        async with dsec.AsyncClient(srv.url, srv.token) as root:
            await root.projects.create("kept", quota=dsec.Quota(sandboxes=1))
            await root.projects.create("other")
            tok = await root.projects.create_token("kept")
            other = await root.projects.create_token("other")
        async with dsec.AsyncClient(srv.url, tok) as c:
            sb = await c.create(memory_mb=64)
        srv.kill()  # SIGKILL: the sandbox keeps running
        srv.start()
        async with dsec.AsyncClient(srv.url, tok) as c:
            assert (await c.get(sb.id)).info.project == "kept"
            with pytest.raises(dsec.QuotaExceeded):  # what it holds is still counted
                await c.create(memory_mb=64)
        async with dsec.AsyncClient(srv.url, other) as o:
            with pytest.raises(dsec.NotFound):
                await o.get(sb.id)
    finally:
        srv.destroy()


async def test_only_a_grader_or_admin_token_runs_the_grading_step(client, name):
    """grading=True reaches protected paths: a user token (what an agent's harness holds)
    gets 403 on exec, exec stream and a background process, each audited; a grader token
    of the project reads them, and an ordinary command of the grader stays confined."""
    await client.projects.create(name)
    user = await client.projects.create_token(name, role="user")
    grader = await client.projects.create_token(name, role="grader")
    async with dsec.AsyncClient(client.url, user) as u, \
            dsec.AsyncClient(client.url, grader) as g:
        sb = await u.create(memory_mb=64, protected_paths=["/grader"])
        try:
            with pytest.raises(dsec.Forbidden, match="/grader/secret.txt.* is protected"):
                await sb.files.write("/grader/secret.txt", b"answer-42\n")
            await (await g.get(sb.id)).files.write("/grader/secret.txt", b"answer-42\n")
            body = {"cmd": "cat /grader/secret.txt", "grading": True}
            for call in (sb.exec("cat /grader/secret.txt", grading=True),
                         sb.exec_stream("cat /grader/secret.txt", grading=True).__anext__(),
                         u._request("POST", f"/v1/sandboxes/{sb.id}/processes", json=body)):
                with pytest.raises(dsec.Forbidden, match="grading=True .* user token may not"):
                    await call
            assert (await sb.exec("cat /grader/secret.txt")).exit_code != 0
            as_grader = await g.get(sb.id)
            r = await as_grader.exec("cat /grader/secret.txt", grading=True)
            assert (r.exit_code, r.stdout) == (0, "answer-42\n")
            events = [ev async for ev in as_grader.exec_stream("cat /grader/secret.txt",
                                                               grading=True)]
            assert "answer-42" in "".join(ev.data or "" for ev in events)
            assert (await as_grader.exec("cat /grader/secret.txt")).exit_code != 0
            grader_made = await g.create(memory_mb=64)  # a grader is a user too
            await grader_made.stop()
        finally:
            await sb.stop()
    refused = [e for e in await client.projects.audit(name)
               if e.target == "grading=True" and e.outcome.startswith("forbidden")]
    assert len(refused) == 3
