"""Tokens a token mints: never longer-lived, higher or wider than the token minting them;
and what a revoked token's calls already under way do. Against the real server."""

from __future__ import annotations

import secrets
import time

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


async def test_a_minted_token_never_outlives_its_minter(short_admin, name):
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
    # the root token never expires: what it mints may not either
    root_made = await c.projects.tokens(name)
    assert [t.expires_at for t in root_made if t.id == minter.id] == [minter.expires_at]


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
