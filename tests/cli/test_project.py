"""dsec project ... and dsec rm --all, with the real command against the session server.

``rm --all`` runs with a token of a fresh project, so "every sandbox it sees" is that
project's two and nothing of the other tests sharing the server.
"""

from __future__ import annotations

import json
import secrets

import pytest

import dsec
from tests.cli.conftest import DSEC, one_error_line, run_cli
from tests.cli.terminal import Terminal


@pytest.fixture
def team(sync_client):
    """A fresh project with a user token and two sandboxes in it."""
    name = f"cli{secrets.token_hex(4)}"
    sync_client.projects.create(name, quota=dsec.Quota(sandboxes=5))
    token = sync_client.projects.create_token(name)
    with dsec.Client(sync_client.url, token) as c:
        made = [c.create(memory_mb=64).id for _ in range(2)]
        yield name, token, c, made
        c.stop_all()


def test_rm_all_refuses_without_yes_and_says_how_many(env, team):
    name, token, c, made = team
    r = run_cli({**env, "DSEC_TOKEN": token}, "rm", "--all")
    assert r.returncode == 1
    assert one_error_line(r.stderr) == (f"error: --all would stop 2 sandboxes ({name}); add "
                                        "--yes to confirm")
    assert sorted(i.id for i in c.list()) == sorted(made)  # nothing stopped

    r = run_cli({**env, "DSEC_TOKEN": token}, "rm", "--all", "--yes")
    assert r.returncode == 0, r.stderr
    assert "stopped 2 sandboxes" in r.stderr
    assert c.list() == []


def test_rm_all_asks_on_a_terminal(env, team):
    name, token, c, made = team
    t = Terminal([*DSEC, "rm", "--all"], {**env, "DSEC_TOKEN": token})
    try:
        t.read_until(f"stop 2 sandboxes ({name})? [y/N]".encode())
        t.type("n\r")
        assert t.wait() == 1
    finally:
        t.close()
    assert sorted(i.id for i in c.list()) == sorted(made)
    t = Terminal([*DSEC, "rm", "--all"], {**env, "DSEC_TOKEN": token})
    try:
        t.read_until(b"[y/N]")
        t.type("y\r")
        assert t.wait() == 0
    finally:
        t.close()
    assert c.list() == []


def test_project_commands(cli, env, sync_client):
    name = f"cli{secrets.token_hex(4)}"
    r = cli("project", "create", name, "--sandboxes", "10", "--memory-mb", "4096")
    assert r.returncode == 0 and r.stdout.startswith("prj-"), r.stderr
    r = cli("project", "create", f"{name}/a", "--sandboxes", "11")
    assert r.returncode == 1
    assert "at most 10" in one_error_line(r.stderr)
    assert cli("project", "create", f"{name}/a", "--sandboxes", "4").returncode == 0
    r = cli("project", "token", f"{name}/a", "--role", "viewer")
    assert r.returncode == 0 and "not shown again" in r.stderr
    secret = r.stdout.strip()
    minted = cli("project", "tokens", f"{name}/a").stdout
    assert "MINTED BY" in minted and "root" in minted
    listed = cli("project", "ls")
    assert f"{name}/a" in listed.stdout and "0/4" in listed.stdout
    viewer = run_cli({**env, "DSEC_TOKEN": secret}, "create")
    assert viewer.returncode == 1 and "needs user" in one_error_line(viewer.stderr)
    audit = cli("project", "audit", name)
    assert "forbidden" in audit.stdout and "POST /v1/projects" in audit.stdout
    assert cli("project", "revoke", secret).returncode == 0
    r = run_cli({**env, "DSEC_TOKEN": secret}, "ls")
    assert r.returncode == 1 and "was revoked" in one_error_line(r.stderr)
    assert cli("project", "rm", f"{name}/a").returncode == 0
    assert cli("project", "usage", name).stdout.split()[:2] == ["sandboxes", "0"]
    as_json = json.loads(cli("project", "ls", "--json").stdout)
    assert any(p["path"] == name and p["quota"]["sandboxes"] == 10 for p in as_json)
    assert json.loads(cli("project", "usage", name, "--json").stdout)["sandboxes"] == 0
