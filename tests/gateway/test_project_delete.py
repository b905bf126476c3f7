"""A project deleted and made again at the same path starts clean: the old one's job
leases and snapshots (kept by path on the nodes) refuse the delete until they are gone,
and its audit entries are not the new one's. Against the real server."""

from __future__ import annotations

import secrets

import httpx
import pytest

import dsec


@pytest.fixture
def name() -> str:
    return f"t{secrets.token_hex(4)}"


@pytest.fixture
async def tags(client):
    """Image tags a test makes; the root token removes those left afterwards."""
    made: list[str] = []
    yield made
    for tag in made:
        try:
            await client.remove_image(tag)
        except dsec.NotFound:
            pass


async def _snapshot(c: dsec.AsyncClient, tag: str) -> None:
    sb = await c.create(memory_mb=64)
    try:
        await sb.files.write("/mark", b"old")
        await sb.pack_diff(tag)
    finally:
        await sb.stop()


async def test_a_project_holding_a_job_lease_is_deleted_once_the_job_is_stopped(client, name):
    await client.projects.create(name)
    job = f"run-{secrets.token_hex(3)}"
    async with dsec.AsyncClient(client.url, await client.projects.create_token(name)) as c:
        await c.jobs.heartbeat(job, lease_s=3600)
        with pytest.raises(dsec.Conflict, match=f"holds the job lease of {job!r}.*stop"):
            await client.projects.delete(name)
        await c.jobs.stop(job)
    await client.projects.delete(name)
    await client.projects.create(name)
    async with dsec.AsyncClient(client.url, await client.projects.create_token(name)) as c:
        assert job not in [j.job for j in await c.jobs.list()]


async def test_a_project_owning_snapshots_is_deleted_once_its_admin_removed_them(
        client, name, tags):
    await client.projects.create(name)
    tag = f"{name}/snap:v1"
    tags.append(tag)
    admin = await client.projects.create_token(name, role="admin")
    async with dsec.AsyncClient(client.url, admin) as c:
        await _snapshot(c, tag)
        with pytest.raises(dsec.Conflict, match=f"holds the snapshot {tag!r}.*remove"):
            await client.projects.delete(name)
        await c.remove_image(tag)  # a project's admin removes its own project's snapshot
        with pytest.raises(dsec.Forbidden, match="shared"):
            await c.remove_image("busybox")  # never a shared image
    await client.projects.delete(name)
    await client.projects.create(name)
    async with dsec.AsyncClient(client.url, await client.projects.create_token(name)) as c:
        assert tag not in [i.name for i in await c.images()]
        with pytest.raises(dsec.NotFound):
            await c.create(memory_mb=64, image=tag)


async def test_an_admin_removes_no_other_projects_snapshot(client, name, tags, server):
    for child in ("", "/a", "/b"):
        await client.projects.create(name + child)
    tag = f"{name}/a-snap:v1"
    tags.append(tag)
    async with dsec.AsyncClient(client.url, await client.projects.create_token(
            f"{name}/a")) as a:
        await _snapshot(a, tag)
    b_admin = await client.projects.create_token(f"{name}/b", role="admin")
    gone = f"{name}/none:v1"
    async with httpx.AsyncClient(base_url=server.url,
                                 headers={"authorization": f"Bearer {b_admin}"}) as b:
        got, want = await b.delete(f"/v1/images/{tag}"), await b.delete(f"/v1/images/{gone}")
    assert got.status_code == want.status_code == 404
    assert got.text.replace(tag, "T") == want.text.replace(gone, "T")
    user = await client.projects.create_token(f"{name}/a", role="user")
    async with dsec.AsyncClient(client.url, user) as a:
        with pytest.raises(dsec.Forbidden, match="needs admin"):
            await a.remove_image(tag)
        assert tag in [i.name for i in await a.images()]
    parent_admin = await client.projects.create_token(name, role="admin")
    async with dsec.AsyncClient(client.url, parent_admin) as p:
        listed = {i.name: i.project for i in await p.images()}
        assert listed[tag] == f"{name}/a" and listed["busybox:latest"] is None
        await p.remove_image(tag)  # an admin above the project may


async def test_a_recreated_projects_audit_log_starts_empty(client, name):
    await client.projects.create(name)
    await client.projects.create(f"{name}/a")
    old = await client.projects.create_token_info(f"{name}/a", role="viewer")
    async with dsec.AsyncClient(client.url, old.token) as v:
        with pytest.raises(dsec.Forbidden):
            await v.create(memory_mb=64)
    await client.projects.delete(f"{name}/a")
    await client.projects.create(f"{name}/a")
    admin = await client.projects.create_token_info(f"{name}/a", role="admin")
    async with dsec.AsyncClient(client.url, admin.token) as a:
        seen = await a.projects.audit(f"{name}/a", limit=1000)
    assert not [e for e in seen if old.id in e.who + e.target]
    # its own making and its token, nothing older
    assert [e.action for e in seen] == ["POST /v1/projects/tokens", "POST /v1/projects"]
    # the parent's admins keep the whole history of what was below them
    kept = await client.projects.audit(name, limit=1000)
    assert [e for e in kept if e.who == old.id]
