"""Protected paths through the files API: a user (or viewer) token, what an agent's harness
holds, gets 403 naming the path for every file operation that would reach one, through the
dsec SDK, the E2B SDK (envd's RPCs and its signed URLs) and SWE-ReX; tricks made by agent
commands (symlinks, ``..``) lead nowhere; the grader's own token still reads and writes.

Each attack is followed by a check, as the grader, that the protected files are exactly as
written, so a refusal that came too late (after a truncation, say) fails on the content.
"""

from __future__ import annotations

import io
import secrets
import tarfile

import httpx
import pytest

import dsec
from tests.support.layers import import_linked_layer

SECRET = b"expected-answer-42\n"
HIDDEN = b"#!/bin/sh\necho hidden test\n"
PROTECTED = ["/grader", "/repo/tests/hidden.sh"]


class Roles:
    """One project's sandbox with protected paths, as each role sees it."""

    def __init__(self, url: str, tokens: dict[str, str]) -> None:
        self.url, self.tokens = url, tokens
        self.clients: dict[str, dsec.AsyncClient] = {}
        self.sb: dict[str, object] = {}

    async def open(self, sb_id: str) -> None:
        for role, tok in self.tokens.items():
            c = dsec.AsyncClient(self.url, tok)
            self.clients[role] = c
            self.sb[role] = await c.get(sb_id)

    async def close(self) -> None:
        for c in self.clients.values():
            await c.close()


@pytest.fixture
async def roles(client, server):
    name = f"pf{secrets.token_hex(4)}"
    await client.projects.create(name)
    tokens = {role: await client.projects.create_token(name, role=role)
              for role in ("user", "viewer", "grader")}
    r = Roles(client.url, tokens)
    async with dsec.AsyncClient(client.url, tokens["user"]) as u:
        sb = await u.create(memory_mb=128, protected_paths=PROTECTED)
    try:
        await r.open(sb.id)
        g = r.sb["grader"]
        await g.files.write("/grader/secret.txt", SECRET)  # the grader's files API writes
        await g.files.write("/repo/tests/hidden.sh", HIDDEN)
        await g.files.write("/repo/calc.sh", b"echo 3\n")
        r.id = sb.id
        yield r
    finally:
        await r.sb["grader"].stop()
        await r.close()


async def intact(r: Roles) -> None:
    g = r.sb["grader"]
    assert await g.files.read("/grader/secret.txt") == SECRET
    assert await g.files.read("/repo/tests/hidden.sh") == HIDDEN
    assert [e.name for e in await g.files.list("/grader")] == ["secret.txt"]


def forbidden(path: str):
    return pytest.raises(dsec.Forbidden, match=f"{path}.* is protected")


async def agent(r: Roles, cmd: str) -> None:
    """An agent command (Landlock-confined) preparing a trick."""
    res = await r.sb["user"].exec(cmd)
    assert res.exit_code == 0, res


# ---- the dsec SDK ----

@pytest.mark.parametrize("role", ["user", "viewer"])
@pytest.mark.parametrize("path", ["/grader/secret.txt", "/repo/tests/hidden.sh",
                                  "/repo/tests/../tests/hidden.sh", "/tmp/../grader/secret.txt",
                                  "//grader//secret.txt"])
async def test_reading_is_forbidden(roles, role, path):
    with pytest.raises(dsec.Forbidden, match="is protected") as err:
        await roles.sb[role].files.read(path)
    assert err.value.status == 403 and path.replace("//", "/") in err.value.message
    with forbidden(""):
        await roles.sb[role].files.stat(path)


@pytest.mark.parametrize("link,target,read", [
    ("/tmp/l", "/grader/secret.txt", "/tmp/l"),           # a file symlink
    ("/tmp/g", "/grader", "/tmp/g/secret.txt"),            # a directory symlink
    ("/tmp/r", "/", "/tmp/r/grader/secret.txt"),           # the root, by a symlink
    ("/tmp/rel", "../grader/secret.txt", "/tmp/rel"),     # a relative one climbing out
    ("/tmp/h", "/repo/tests/hidden.sh", "/tmp/h"),
])
async def test_a_symlink_made_by_an_agent_command_leads_nowhere(roles, link, target, read):
    await agent(roles, f"ln -s {target} {link}")
    sb = roles.sb["user"]
    with pytest.raises(dsec.Forbidden, match="it resolves to /(grader|repo/tests/hidden)"):
        await sb.files.read(read)
    with pytest.raises(dsec.Forbidden):
        await sb.files.write(read, b"forged")
    with pytest.raises(dsec.Forbidden):
        await sb.files.download_tar(read)
    await intact(roles)


async def test_writing_is_forbidden_and_changes_nothing(roles):
    sb = roles.sb["user"]
    for path in ("/grader/secret.txt", "/grader/new.txt", "/repo/tests/hidden.sh",
                 "/grader/deep/er/x"):
        with forbidden(path):
            await sb.files.write(path, b"forged")
    with forbidden("/grader/x"):
        await sb.files.upload(io.BytesIO(b"forged"), "/grader/x")
    await intact(roles)


async def test_a_dangling_symlink_into_a_protected_dir_creates_nothing(roles):
    await agent(roles, "ln -s /grader/planted /tmp/d")
    with pytest.raises((dsec.Forbidden, dsec.InvalidArgument), match="/tmp/d"):
        await roles.sb["user"].files.write("/tmp/d", b"planted")
    await intact(roles)


async def test_listing_removing_and_mkdir_are_forbidden(roles):
    sb = roles.sb["user"]
    with forbidden("/grader"):
        await sb.files.list("/grader")
    for path, recursive in (("/grader/secret.txt", False), ("/grader", True),
                            ("/repo/tests/hidden.sh", False)):
        with forbidden(path):
            await sb.files.remove(path, recursive=recursive)
    with pytest.raises(dsec.Forbidden, match="/repo holds the protected path"):
        await sb.files.remove("/repo", recursive=True)
    for path in ("/grader/sub", "/grader/a/b"):
        with forbidden(path):
            await sb.files.mkdir(path)
    await intact(roles)


async def test_a_parent_lists_the_name_but_not_the_contents(roles):
    sb = roles.sb["user"]
    assert "grader" in [e.name for e in await sb.files.list("/")]
    assert [e.name for e in await sb.files.list("/repo/tests")] == ["hidden.sh"]
    assert await sb.files.read("/repo/calc.sh") == b"echo 3\n"  # the rest works
    await sb.files.write("/tmp/ok.txt", b"fine")
    assert await sb.files.read("/tmp/ok.txt") == b"fine"


async def test_tar_download_and_upload_are_forbidden(roles, tmp_path):
    sb = roles.sb["user"]
    for path in ("/grader", "/grader/secret.txt"):
        with forbidden(path):
            await sb.files.download_tar(path)
        with forbidden(path):
            await sb.files.download(path, tmp_path / "out")
    for path in ("/", "/repo"):  # a whole tree holding one
        with pytest.raises(dsec.Forbidden, match=f"{path} holds the protected path"):
            await sb.files.download_tar(path)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("grader/secret.txt")
        info.size = 6
        tar.addfile(info, io.BytesIO(b"forged"))
    for dest in ("/", "/grader"):
        with pytest.raises(dsec.Forbidden):
            await sb.files.upload_tar(buf.getvalue(), dest)
    await intact(roles)


async def test_the_grader_reads_writes_and_lists(roles, client):
    g = roles.sb["grader"]
    await intact(roles)
    await g.files.mkdir("/grader/sub")
    await g.files.write("/grader/sub/more.txt", b"more")
    assert {e.name for e in await g.files.list("/grader")} == {"secret.txt", "sub"}
    data = await g.files.download_tar("/grader")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert "grader/secret.txt" in tar.getnames()
    await g.files.remove("/grader/sub", recursive=True)
    root = await client.get(roles.id)  # the root token is an admin: it may grade too
    assert await root.files.read("/grader/secret.txt") == SECRET


async def test_what_the_grader_wrote_stays_out_of_the_trajectory(roles):
    page = await roles.sb["viewer"].trajectory()
    text = page.model_dump_json()
    assert "/repo/calc.sh" in text  # other writes are logged
    assert "/grader/secret.txt" not in text and "hidden.sh" not in text, text


async def test_the_grading_steps_output_stays_out_of_the_trajectory(roles):
    """The grading step may print a protected file; the log any token of the project
    reads must not keep it (nor replay it to a later caller)."""
    g = roles.sb["grader"]
    for _ in range(2):  # the second is run again, not answered from the log
        r = await g.exec("cat /grader/secret.txt; echo graded-$RANDOM", grading=True)
        assert r.stdout.startswith(SECRET.decode()), r
    assert await roles.sb["user"].exec("echo agent-step") is not None
    text = (await roles.sb["viewer"].trajectory()).model_dump_json()
    assert "agent-step" in text  # the agent's own steps are logged
    assert SECRET.decode().strip() not in text and "graded-" not in text, text


async def test_a_users_snapshot_leaves_the_protected_paths_out(roles, client):
    tag = f"pf/{secrets.token_hex(4)}:v1"
    await roles.sb["user"].pack_diff(tag)
    sb = await client.create(image=tag, memory_mb=64)
    try:
        assert await sb.files.read("/repo/calc.sh") == b"echo 3\n"
        assert not await sb.files.exists("/grader/secret.txt")
        assert not await sb.files.exists("/repo/tests/hidden.sh")
    finally:
        await sb.stop()
        await client.remove_image(tag)


# ---- SWE-ReX ----

async def test_swerex_read_and_write_file_are_refused(roles):
    from swerex.runtime.abstract import ReadFileRequest, WriteFileRequest

    from dsec.integrations.swerex import DsecRuntime
    rt = DsecRuntime(roles.sb["user"])
    with pytest.raises(dsec.Forbidden):
        await rt.read_file(ReadFileRequest(path="/grader/secret.txt"))
    with pytest.raises(dsec.Forbidden):
        await rt.write_file(WriteFileRequest(path="/grader/secret.txt", content="forged"))
    await intact(roles)


# ---- the E2B SDK ----

@pytest.fixture
def e2b_user(roles, server, monkeypatch):
    """The unmodified E2B SDK, connected to the sandbox with the user token as API key."""
    from e2b import Sandbox
    monkeypatch.setenv("E2B_API_URL", f"{server.url}/e2b")
    monkeypatch.setenv("E2B_SANDBOX_URL", f"{server.url}/e2b/envd")
    monkeypatch.setenv("E2B_API_KEY", roles.tokens["user"])
    return Sandbox.connect(roles.id)


def test_e2b_files_are_refused(roles, e2b_user):
    from e2b import SandboxException
    sb = e2b_user
    for call in (lambda: sb.files.read("/grader/secret.txt"),
                 lambda: sb.files.write("/grader/secret.txt", "forged"),
                 lambda: sb.files.list("/grader"),
                 lambda: sb.files.get_info("/grader/secret.txt"),
                 lambda: sb.files.make_dir("/grader/sub"),
                 lambda: sb.files.remove("/grader/secret.txt"),
                 lambda: sb.files.read("/tmp/../grader/secret.txt")):
        with pytest.raises(SandboxException, match="is protected"):
            call()
    sb.files.write("/tmp/x", "mine")
    with pytest.raises(SandboxException, match="is protected"):
        sb.files.rename("/tmp/x", "/grader/x")  # rename into it
    assert sb.files.read("/tmp/x") == "mine"


def test_e2b_signed_urls_are_refused(roles, e2b_user):
    r = httpx.get(e2b_user.download_url("/grader/secret.txt"))
    assert r.status_code == 403 and "is protected" in r.text, r.text
    r = httpx.post(e2b_user.upload_url("/grader/secret.txt"), files={"file": b"forged"})
    assert r.status_code == 403 and "is protected" in r.text, r.text


async def test_e2b_intact_after_its_attacks(roles, e2b_user):
    e2b_user.files.write("/tmp/y", "z")
    with pytest.raises(Exception):
        e2b_user.files.write("/grader/secret.txt", "forged")
    await intact(roles)


# ---- hard links shipped in an image layer ----

@pytest.fixture
async def linked_layer(client, server, tmp_path):
    """A layer whose /srv/h (and /srv/d/h2) is a hard link to its /grader/secret.txt."""
    from dsec.images import ImageService
    tag = await import_linked_layer(ImageService(server.state_dir), tmp_path / "layer", "pf",
                                    SECRET, extra={"srv/plain.txt": b"plain\n"})
    yield tag
    await client.remove_image(tag)


async def test_an_image_giving_a_protected_file_another_name_is_refused(roles, linked_layer):
    with pytest.raises(dsec.InvalidArgument, match="protected file /grader/secret.txt 2 more"):
        await roles.clients["user"].create(image="busybox", layers=[linked_layer],
                                           memory_mb=64, protected_paths=["/grader"])
    # both names protected: nothing reaches the file by a name outside
    sb = await roles.clients["user"].create(image="busybox", layers=[linked_layer],
                                            memory_mb=64, protected_paths=["/grader", "/srv"])
    await sb.stop()


async def test_a_hard_link_the_grading_step_made_is_refused(roles):
    """Across directories the grading step cannot make one (tests/redteam/
    test_protected_paths.py); beside a protected file it can, and the files API refuses
    that name by inode (tests/node/host/test_hardlinks.py: every other operation)."""
    sb, g = roles.sb["user"], roles.sb["grader"]
    r = await g.exec("ln /repo/tests/hidden.sh /repo/tests/h2 && echo plain > /srv.txt",
                     grading=True)
    assert r.exit_code == 0, r
    for path in ("/repo/tests/h2", "/repo/tests/../tests/h2"):
        with pytest.raises(dsec.Forbidden, match=f"{path} is protected: it is a hard link"):
            await sb.files.read(path)
        with forbidden(path):
            await sb.files.write(path, b"forged")
        with forbidden(path):
            await sb.files.stat(path)
    r = await g.exec("ln /grader/secret.txt /srv.h", grading=True)
    assert r.exit_code != 0 and "cross-device" in r.stderr, r
    with pytest.raises(dsec.NotFound):
        await sb.files.read("/srv.h")
    assert await sb.files.read("/srv.txt") == b"plain\n"  # the rest stays open
    assert await g.files.read("/repo/tests/h2") == HIDDEN  # the grader still reads it
    await intact(roles)
