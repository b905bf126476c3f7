"""Tokens a token mints: never longer-lived, higher or wider than the token minting them;
and what a revoked token's calls already under way do. Against the real server."""

from __future__ import annotations

import asyncio
import json
import secrets
import struct
import time
from collections.abc import AsyncIterator

import httpx
import pytest

import dsec
from dsec.api.projects import Quota
from dsec.gateway.projects import Projects


@pytest.fixture
def name() -> str:
    return f"t{secrets.token_hex(4)}"


@pytest.fixture
async def short_admin(client, name):
    """An admin token of ``name`` (with sub-projects a and b) that expires in an hour."""
    await client.projects.create(name)
    for child in ("a", "b"):
        await client.projects.create(f"{name}/{child}")
    made = await client.projects.create_token_info(name, role="admin", ttl_s=3600)
    async with dsec.AsyncClient(client.url, made.token) as c:
        yield made, c


async def test_a_minted_token_never_outlives_its_minter(client, short_admin, name):
    minter, c = short_admin
    for path in (name, f"{name}/a"):
        with pytest.raises(dsec.InvalidArgument, match=r"ttl_s can be at most 3[0-9]{3} s.*"
                                                       f"{minter.id}"):
            await c.projects.create_token(path, ttl_s=7200)
        forever = await c.projects.create_token_info(path, ttl_s=None)
        assert forever.expires_at == pytest.approx(minter.expires_at)
        shorter = await c.projects.create_token_info(path, ttl_s=60)
        assert shorter.expires_at == pytest.approx(time.time() + 60, abs=5)
        assert forever.created_by == shorter.created_by == minter.id
    # the root token never expires: what it mints without a ttl_s does not either
    forever = await client.projects.create_token_info(name, ttl_s=None)
    assert (forever.expires_at, forever.created_by) == (None, "root")


async def test_a_token_mints_for_its_own_project_and_below_only(client, short_admin, name):
    _, c = short_admin
    a_admin = await c.projects.create_token(f"{name}/a", role="admin", ttl_s=None)
    async with dsec.AsyncClient(client.url, a_admin) as a:
        for path in (name, f"{name}/b"):
            with pytest.raises(dsec.Forbidden, match="not at or below"):
                await a.projects.create_token(path, role="viewer")
        await a.projects.create_token(f"{name}/a", role="viewer", ttl_s=60)
    user = await c.projects.create_token(f"{name}/a", role="user", ttl_s=60)
    async with dsec.AsyncClient(client.url, user) as u:
        with pytest.raises(dsec.Forbidden, match="needs admin"):
            await u.projects.create_token(f"{name}/a", role="admin")


def test_a_token_mints_no_role_above_its_own(tmp_path):
    """Only admins reach the route today; the store refuses a higher role all the same,
    should a lower role ever be let mint."""
    projects = Projects("root-token", tmp_path / "projects.db")
    try:
        projects.store.create("p", Quota())
        made = projects.store.create_token("p", "grader", 3600)
        grader = projects.authenticate(f"Bearer {made.token}".encode())
        with pytest.raises(dsec.Forbidden, match="grader token may not mint an admin"):
            projects.store.create_token("p", "admin", 60, by=grader)
        assert projects.store.create_token("p", "user", 60, by=grader).role == "user"
    finally:
        projects.conn.close()


async def test_a_revoked_minters_tokens_keep_working(client, short_admin, name):
    minter, c = short_admin
    made = await c.projects.create_token(f"{name}/a", role="user", ttl_s=600)
    await client.projects.revoke_token(minter.id)
    async with dsec.AsyncClient(client.url, made) as u:
        assert await u.list() == []
    listed = {t.id: t for t in await client.projects.tokens(f"{name}/a")}
    assert [t.created_by for t in listed.values()] == [minter.id]  # found, to revoke too


def test_a_store_made_before_created_by_gets_the_column(tmp_path):
    import sqlite3

    from dsec.gateway.projects.db import SCHEMA, open_control_db
    old = sqlite3.connect(tmp_path / "projects.db")
    old.executescript(SCHEMA.replace(", created_by TEXT", ""))
    old.execute("INSERT INTO tokens (id, hash, project_id, role, created_at) "
                "VALUES ('tok-old', x'00', 'prj-root', 'user', 0)")
    old.commit()
    old.close()
    conn = open_control_db(tmp_path / "projects.db")
    assert conn.execute("SELECT id, created_by FROM tokens").fetchall() == [("tok-old", None)]
    conn.close()


# ---- calls under way when their token is revoked ----

@pytest.fixture
async def doomed(client, name):
    """A user token of ``name`` (quota: 1 sandbox), a client with it, and its sandbox;
    the test revokes the token. The root token stops what is left."""
    await client.projects.create(name, quota=Quota(sandboxes=1))
    made = await client.projects.create_token_info(name, ttl_s=600)
    async with dsec.AsyncClient(client.url, made.token) as c:
        sb = await c.create(memory_mb=64)
        try:
            yield made, c, sb
        finally:
            for info in await client.list():
                if info.project == name:
                    await (await client.get(info.id)).stop()


async def _ends_unauthorized(client, made, call) -> None:
    """``call`` (a coroutine) runs; once it is under way its token is revoked: it must end
    with Unauthorized within seconds, not when its command does."""
    task = asyncio.ensure_future(call)
    await asyncio.sleep(1.0)
    assert not task.done(), task
    await client.projects.revoke_token(made.id)
    with pytest.raises(dsec.Unauthorized, match="revoked"):
        await asyncio.wait_for(task, 15)


async def _sleeps(client, sb) -> str:
    return (await (await client.get(sb.id)).exec("ps -o pid,args | grep 'sleep 60[0-9]'"
                                                 " | grep -v grep")).stdout


async def test_a_revoked_tokens_exec_ends_and_its_command_with_it(client, doomed):
    made, _, sb = doomed
    await _ends_unauthorized(client, made, sb.exec("sleep 600", timeout=700))
    assert await _sleeps(client, sb) == ""


async def test_a_revoked_tokens_shell_run_ends_and_its_command_with_it(client, doomed):
    made, _, sb = doomed
    sh = await sb.shell()
    await _ends_unauthorized(client, made, sh.run("sleep 601", timeout=700))
    assert await _sleeps(client, sb) == ""
    # the rest of its output would be the next command's: the session ended with it
    with pytest.raises(dsec.SandboxStopped, match="cancelled.*open a new shell"):
        await client._request("POST", f"/v1/sandboxes/{sb.id}/shells/{sh.id}/run",
                              json={"cmd": "true"})


async def test_a_revoked_tokens_process_wait_ends_and_the_process_goes_on(client, doomed):
    made, _, sb = doomed
    proc = await sb.spawn("sleep 602")
    await _ends_unauthorized(client, made, proc.wait(timeout=700))
    assert "sleep 602" in await _sleeps(client, sb)  # the sandbox's, not the token's


async def test_a_revoked_tokens_create_waiting_in_line_makes_nothing(client, doomed, name):
    made, c, sb = doomed
    waiting = asyncio.ensure_future(c.create(memory_mb=64, wait_s=30))
    await asyncio.sleep(1.0)
    assert not waiting.done()
    await client.projects.revoke_token(made.id)
    await (await client.get(sb.id)).stop()  # room comes free: the waiter is admitted
    with pytest.raises(dsec.Unauthorized, match="revoked"):
        await asyncio.wait_for(waiting, 15)
    assert [i for i in await client.list() if i.project == name] == []


async def test_a_revoked_tokens_batch_waiting_in_line_makes_nothing(client, doomed, name):
    made, c, sb = doomed
    waiting = asyncio.ensure_future(c.create_many(2, memory_mb=64, wait_s=30))
    await asyncio.sleep(1.0)
    assert not waiting.done()
    await client.projects.revoke_token(made.id)
    await (await client.get(sb.id)).stop()
    with pytest.raises(dsec.Unauthorized, match="revoked"):
        await asyncio.wait_for(waiting, 15)
    assert [i for i in await client.list() if i.project == name] == []


async def _frames(chunks) -> AsyncIterator[tuple[int, bytes]]:
    """Connect's enveloped messages: (flags, data)."""
    buf = b""
    async for chunk in chunks:
        buf += chunk
        while len(buf) >= 5:
            flags, size = struct.unpack(">BI", buf[:5])
            if len(buf) < 5 + size:
                break
            yield flags, buf[5:5 + size]
            buf = buf[5 + size:]


async def test_a_revoked_keys_e2b_command_stream_ends_unauthenticated(client, name):
    await client.projects.create(name)
    made = await client.projects.create_token_info(name, ttl_s=600)
    async with httpx.AsyncClient(base_url=client.url, timeout=60) as h:
        r = await h.post("/e2b/sandboxes", json={"templateID": "busybox"},
                         headers={"x-api-key": made.token})
        assert r.status_code == 201, r.text
        sb, access = r.json()["sandboxID"], r.json()["envdAccessToken"]
        start = {"process": {"cmd": "/bin/sh", "args": ["-c", "sleep 604"]}}
        body = struct.pack(">BI", 0, len(json.dumps(start))) + json.dumps(start).encode()
        try:
            async with h.stream("POST", "/e2b/envd/process.Process/Start", content=body,
                                headers={"e2b-sandbox-id": sb, "x-access-token": access,
                                         "content-type": "application/connect+json"}) as resp:
                frames = _frames(resp.aiter_bytes())
                assert b'"start"' in (await frames.__anext__())[1]
                await client.projects.revoke_token(made.id)

                async def last() -> tuple[int, bytes]:
                    async for frame in frames:
                        if frame[0] & 0x02:
                            return frame
                    raise AssertionError("the stream ended without an end frame")
                flags, data = await asyncio.wait_for(last(), 15)
            assert json.loads(data)["error"]["code"] == "unauthenticated", data
        finally:
            await (await client.get(sb)).stop()
