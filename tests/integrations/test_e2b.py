"""The unmodified e2b SDK against a real dsec server: E2B_API_URL=<dsec>/e2b,
E2B_SANDBOX_URL=<dsec>/e2b/envd, E2B_API_KEY=<the dsec token>. Sandboxes are busybox
containers (the SDK's ``/bin/bash -l -c`` runs with busybox's sh)."""

from __future__ import annotations

import asyncio
import secrets
import struct
import time

import httpx
import pytest
from e2b import (AsyncSandbox, AuthenticationException, CommandExitException,
                 NotEnoughSpaceException, RateLimitException, Sandbox, SandboxException,
                 SandboxNotFoundException, SandboxQuery, TimeoutException)

import dsec


@pytest.fixture
def made(e2b_env):
    """Sandbox.create with cleanup: call it as made(**create_kwargs)."""
    sandboxes = []

    def make(**kwargs) -> Sandbox:
        sb = Sandbox.create(template=kwargs.pop("template", "busybox"), **kwargs)
        sandboxes.append(sb)
        return sb

    yield make
    for sb in sandboxes:
        sb.kill()


@pytest.fixture
def sbx(made) -> Sandbox:
    return made(timeout=300)


# ---- control plane ----

def test_create_takes_envs_metadata_and_timeout(made):
    sb = made(timeout=120, metadata={"run": "e2b-1"}, envs={"FOO": "bar"})
    assert sb.commands.run("echo $FOO").stdout == "bar\n"
    info = sb.get_info()
    assert info.metadata == {"run": "e2b-1"} and info.template_id == "busybox"
    assert abs(info.end_at.timestamp() - (time.time() + 120)) < 30


def test_list_filters_by_metadata(made):
    a = made(metadata={"team": "a"})
    made(metadata={"team": "b"})
    found = Sandbox.list(query=SandboxQuery(metadata={"team": "a"})).next_items()
    assert [s.sandbox_id for s in found] == [a.sandbox_id]


def test_connect_reaches_the_same_sandbox(sbx):
    sbx.files.write("/tmp/mark", "here")
    again = Sandbox.connect(sbx.sandbox_id)
    assert again.files.read("/tmp/mark") == "here"


def test_set_timeout_moves_the_end(sbx):
    sbx.set_timeout(3000)
    assert abs(sbx.get_info().end_at.timestamp() - (time.time() + 3000)) < 30


def test_kill_ends_the_sandbox(e2b_env):
    sb = Sandbox.create(template="busybox")
    assert sb.kill() is True
    assert sb.sandbox_id not in [s.sandbox_id for s in Sandbox.list().next_items()]
    assert Sandbox.kill(sb.sandbox_id) is False
    assert sb.is_running() is False


def test_pause_and_resume_keep_files(sbx):
    sbx.files.write("/tmp/kept", "1")
    assert sbx.pause() is True
    assert sbx.get_info().state.value == "paused"
    resumed = Sandbox.connect(sbx.sandbox_id)
    assert resumed.get_info().state.value == "running"
    assert resumed.files.read("/tmp/kept") == "1"


# ---- commands ----

def test_run_streams_to_callbacks(sbx):
    out, err = [], []
    r = sbx.commands.run("echo one; echo two >&2; echo three", on_stdout=out.append,
                         on_stderr=err.append)
    assert (r.exit_code, r.stdout, r.stderr) == (0, "one\nthree\n", "two\n")
    assert "".join(out) == "one\nthree\n" and "".join(err) == "two\n"


def test_nonzero_exit_raises_command_exit_exception(sbx):
    with pytest.raises(CommandExitException) as exc:
        sbx.commands.run("echo partial; exit 3")
    assert exc.value.exit_code == 3 and exc.value.stdout == "partial\n"


def test_run_takes_cwd_and_envs(sbx):
    r = sbx.commands.run("pwd; echo $A-$B", cwd="/tmp", envs={"A": "x", "B": "y"})
    assert r.stdout == "/tmp\nx-y\n"


def test_command_timeout_raises_timeout(sbx):
    with pytest.raises(TimeoutException):
        sbx.commands.run("sleep 30", timeout=1)


def test_background_handle_waits(sbx):
    h = sbx.commands.run("sleep 0.5; echo done", background=True)
    assert h.pid > 0
    assert h.wait().stdout == "done\n"


def test_background_handle_kills_and_list_shows_it(sbx):
    h = sbx.commands.run("sleep 60", background=True)
    listed = {p.pid: p for p in sbx.commands.list()}
    assert h.pid in listed and listed[h.pid].args[-1] == "sleep 60"
    assert h.kill() is True
    with pytest.raises(CommandExitException):
        h.wait()
    assert h.pid not in [p.pid for p in sbx.commands.list()]
    assert sbx.commands.kill(h.pid) is False


# ---- files ----

def test_files_round_trip(sbx):
    info = sbx.files.write("/work/sub/a.txt", "hello")
    assert info.path == "/work/sub/a.txt"
    assert sbx.files.read("/work/sub/a.txt") == "hello"
    assert sbx.files.read("/work/sub/a.txt", format="bytes") == b"hello"
    assert [(e.name, e.type.value) for e in sbx.files.list("/work")] == [("sub", "dir")]
    assert sbx.files.exists("/work/sub/a.txt") and not sbx.files.exists("/work/nope")
    assert sbx.files.make_dir("/work/new") is True
    assert sbx.files.make_dir("/work/new") is False
    sbx.files.remove("/work/sub")
    assert not sbx.files.exists("/work/sub/a.txt")


def test_upload_and_download_urls_work_without_headers(sbx):
    up = sbx.upload_url("/tmp/up.bin")
    r = httpx.post(up, files={"file": ("up.bin", b"\x00\x01payload")})
    assert r.status_code == 200, r.text
    r = httpx.get(sbx.download_url("/tmp/up.bin"))
    assert (r.status_code, r.content) == (200, b"\x00\x01payload")
    tampered = sbx.download_url("/tmp/up.bin").replace("up.bin", "other")
    assert httpx.get(tampered).status_code == 401


def test_async_sdk_works_too(e2b_env):
    import asyncio

    async def go():
        sb = await AsyncSandbox.create(template="busybox")
        try:
            r = await sb.commands.run("echo async")
            await sb.files.write("/tmp/x", "y")
            return r.stdout, await sb.files.read("/tmp/x")
        finally:
            await sb.kill()

    assert asyncio.run(go()) == ("async\n", "y")


# ---- projects: a project token as the API key ----

@pytest.fixture
def project(e2b_env):
    """A project with a quota of one sandbox, a user and a viewer token; emptied after."""
    name = f"e2b{secrets.token_hex(4)}"
    with dsec.Client(e2b_env.url, e2b_env.token) as root:
        root.projects.create(name, quota=dsec.Quota(sandboxes=1))
        user = root.projects.create_token(name, role="user")
        viewer = root.projects.create_token(name, role="viewer")
        yield root, name, user, viewer
        for info in root.list():
            if info.project == name and info.state not in ("stopped", "failed"):
                try:
                    root.get(info.id).stop()
                except dsec.NotFound:
                    pass


def test_a_project_tokens_creates_take_its_quota(project, sbx):
    root, name, user, _ = project
    sb = Sandbox.create(template="busybox", api_key=user)
    try:
        assert root.get(sb.sandbox_id).info.project == name
        assert root.projects.usage(name).sandboxes == 1
        with pytest.raises(RateLimitException, match=f"{name}.*quota.sandboxes 1"):
            Sandbox.create(template="busybox", api_key=user)
        # the project sees its own sandbox only: the root's is not found, never touched
        assert [s.sandbox_id for s in Sandbox.list(api_key=user).next_items()] == \
            [sb.sandbox_id]
        with pytest.raises(SandboxNotFoundException):
            Sandbox.connect(sbx.sandbox_id, api_key=user)
        assert Sandbox.kill(sbx.sandbox_id, api_key=user) is False
        assert sbx.is_running()
        assert sb.commands.run("echo in-project").stdout == "in-project\n"
    finally:
        assert sb.kill() is True
    assert root.projects.usage(name).sandboxes == 0  # given back at once, not at reconcile
    again = Sandbox.create(template="busybox", api_key=user)
    again.kill()


def test_a_quota_refusal_is_429_not_retried_by_the_sdk(project, e2b_env):
    _, _, user, _ = project
    holder = Sandbox.create(template="busybox", api_key=user)
    try:
        r = httpx.post(f"{e2b_env.url}/e2b/sandboxes", json={"templateID": "busybox"},
                       headers={"X-API-Key": user})
        assert r.status_code == 429 and r.json()["code"] == 429
        assert r.headers["retry-after"].isdigit() and r.headers["should-retry"] == "false"
        with pytest.raises(RateLimitException, match="after waiting 1s"):
            Sandbox.create(template="busybox", api_key=user, metadata={"dsec.wait_s": "1"})
    finally:
        holder.kill()


def test_a_waiting_create_is_served_when_room_comes_free(project):
    _, name, user, _ = project

    async def go() -> str:
        holder = await AsyncSandbox.create(template="busybox", api_key=user)
        waiting = asyncio.ensure_future(AsyncSandbox.create(
            template="busybox", api_key=user, metadata={"dsec.wait_s": "60"}))
        await asyncio.sleep(0.2)  # not a synchronisation: served either way
        assert not waiting.done()
        await holder.kill()
        sb = await waiting
        out = (await sb.commands.run("echo served")).stdout
        await sb.kill()
        return out

    assert asyncio.run(go()) == "served\n"


def test_roles_and_revocation_hold_for_the_e2b_api(project, e2b_env):
    root, name, user, viewer = project
    assert Sandbox.list(api_key=viewer).next_items() == []
    sb = Sandbox.create(template="busybox", api_key=user)
    try:  # a viewer reads it, but gets no envd access token (it would run commands)
        assert Sandbox.get_info(sb.sandbox_id, api_key=viewer).sandbox_id == sb.sandbox_id
        r = httpx.get(f"{e2b_env.url}/e2b/sandboxes/{sb.sandbox_id}",
                      headers={"X-API-Key": viewer})
        assert r.status_code == 200 and "envdAccessToken" not in r.json()
        with pytest.raises(SandboxException) as denied:
            Sandbox.kill(sb.sandbox_id, api_key=viewer)
        assert denied.value.status_code == 403 and sb.is_running()
    finally:
        sb.kill()
    with pytest.raises(SandboxException) as exc:
        Sandbox.create(template="busybox", api_key=viewer)
    assert exc.value.status_code == 403 and "needs user" in str(exc.value)
    made = root.projects.create_token_info(name, role="user")
    root.projects.revoke_token(made.id)
    with pytest.raises(AuthenticationException, match="revoked"):
        Sandbox.create(template="busybox", api_key=made.token)
    refused = [e.outcome.split(":")[0] for e in root.projects.audit(name)
               if e.action.startswith("POST /e2b")]
    assert "forbidden" in refused


# ---- bad input ----

def test_wrong_key_is_the_sdks_auth_error(e2b_env, monkeypatch):
    monkeypatch.setenv("E2B_API_KEY", "not-the-token")
    with pytest.raises(AuthenticationException):
        Sandbox.create(template="busybox")
    with pytest.raises(AuthenticationException):
        Sandbox.list().next_items()


def test_wrong_access_token_is_refused(sbx, e2b_env):
    r = httpx.post(f"{e2b_env.url}/e2b/envd/process.Process/List", json={},
                   headers={"E2b-Sandbox-Id": sbx.sandbox_id, "X-Access-Token": "guess"})
    assert r.status_code == 401 and r.json()["code"] == "unauthenticated"


def test_unknown_template_names_it(e2b_env):
    with pytest.raises(SandboxException) as exc:
        Sandbox.create(template="no-such-image")
    assert "template 'no-such-image' not found" in str(exc.value)
    assert exc.value.status_code == 404


def test_an_unserved_call_is_the_sdks_error_naming_it(sbx, e2b_env):
    with pytest.raises(SandboxException) as exc:
        sbx.get_metrics()
    assert exc.value.status_code == 501 and "metrics" in str(exc.value)
    r = httpx.post(f"{e2b_env.url}/e2b/envd/process.Process/Nope", json={})
    assert r.status_code == 501 and r.json()["code"] == "unimplemented"


def test_output_over_the_limit_is_an_error_not_a_cut(sbx):
    with pytest.raises(SandboxException) as exc:
        sbx.commands.run("head -c 17000000 /dev/zero")
    assert "max_output_bytes" in str(exc.value)


def test_file_over_the_disk_limit_is_not_enough_space(made):
    sb = made(metadata={"dsec.disk_mb": "4"})
    with pytest.raises(NotEnoughSpaceException) as exc:
        sb.files.write("/tmp/big", b"x" * (6 << 20))
    assert "disk_mb" in str(exc.value)


def test_protobuf_codec_is_refused_by_name(sbx, e2b_env):
    r = httpx.post(f"{e2b_env.url}/e2b/envd/process.Process/List", content=b"",
                   headers={"E2b-Sandbox-Id": sbx.sandbox_id, "content-type": "application/proto",
                            "X-Access-Token": sbx._envd_access_token})
    assert r.status_code == 400 and "application/json" in r.json()["message"]


def test_stream_envelope_must_match_its_length(sbx, e2b_env):
    body = struct.pack(">BI", 0, 100) + b"{}"
    r = httpx.post(f"{e2b_env.url}/e2b/envd/process.Process/Start", content=body,
                   headers={"E2b-Sandbox-Id": sbx.sandbox_id, "X-Access-Token":
                            sbx._envd_access_token, "content-type": "application/connect+json"})
    flags, size = struct.unpack(">BI", r.content[:5])
    assert r.status_code == 200 and flags == 2 and b"invalid_argument" in r.content[5:]


# ---- cluster mode ----

@pytest.fixture(scope="module")
def gateway(server, tmp_path_factory):
    """A gateway process of its own over the session server's node agent (HTTP NodeClient)."""
    from tests.support.server import ServerProcess
    state = tmp_path_factory.mktemp("e2b-gateway")
    for name in ("token", "cluster_token"):  # the node it fronts takes the server's token
        (state / name).write_text(server.token + "\n")
        (state / name).chmod(0o600)
    gw = ServerProcess(state_dir=state, extra_args=["--node", server.url]).start()
    yield gw
    gw.destroy()


def test_the_sdk_works_through_a_gateway_over_a_remote_node(gateway, monkeypatch):
    monkeypatch.setenv("E2B_API_URL", f"{gateway.url}/e2b")
    monkeypatch.setenv("E2B_SANDBOX_URL", f"{gateway.url}/e2b/envd")
    monkeypatch.setenv("E2B_API_KEY", gateway.token)
    sb = Sandbox.create(template="busybox", metadata={"via": "gateway"})
    try:
        assert sb.commands.run("echo far; echo err >&2").stdout == "far\n"
        h = sb.commands.run("sleep 60", background=True)
        assert h.pid in [p.pid for p in sb.commands.list()] and h.kill()
        sb.files.write("/tmp/f", "remote")
        assert sb.files.read("/tmp/f") == "remote"
        assert httpx.get(sb.download_url("/tmp/f")).content == b"remote"
        sb.set_timeout(1800)
        assert abs(sb.get_info().end_at.timestamp() - (time.time() + 1800)) < 30
        assert [s.sandbox_id for s in Sandbox.list(
            query=SandboxQuery(metadata={"via": "gateway"})).next_items()] == [sb.sandbox_id]
    finally:
        sb.kill()
