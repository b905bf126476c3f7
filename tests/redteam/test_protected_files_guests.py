"""Protected paths through the files API in microvm and vm guests: a user token gets 403
naming the path for every file operation that reaches one, symlinks made by agent commands
(and ``..``, ``//``) lead nowhere, and a grader token still reads and writes. Real QEMU
guests (TCG here), so one guest per backend and many checks in it.

Each attack is followed, at the end, by a check as the grader that the protected file is
exactly as written, so a refusal that came after a truncation fails on the content.
"""

from __future__ import annotations

import io
import secrets
import tarfile

import pytest

import dsec
from tests.support.layers import import_linked_layer

pytestmark = pytest.mark.timeout(900)

SECRET = b"expected-answer-42\n"
LINKS = [("/tmp/l", "/grader/secret.txt", "/tmp/l"),          # a file symlink
         ("/tmp/g", "/grader", "/tmp/g/secret.txt"),           # a directory symlink
         ("/tmp/r", "/", "/tmp/r/grader/secret.txt"),          # the root, by a symlink
         ("/tmp/rel", "../grader/secret.txt", "/tmp/rel")]     # a relative one climbing out


async def _tokens(srv) -> dict[str, str]:
    name = f"pg{secrets.token_hex(4)}"
    async with dsec.AsyncClient(srv.url, srv.token) as admin:
        await admin.projects.create(name)
        return {role: await admin.projects.create_token(name, role=role)
                for role in ("user", "grader")}


def _tar(name: str, data: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        ti = tarfile.TarInfo(name)
        ti.size = len(data)
        tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


async def _refused(call, path: str) -> None:
    """``call`` raises Forbidden (403) naming ``path``."""
    with pytest.raises(dsec.Forbidden) as err:
        await call
    assert err.value.status == 403 and path in err.value.message, err.value.message


async def _user_attacks(u) -> None:
    for path in ("/grader/secret.txt", "//grader//secret.txt", "/tmp/../grader/secret.txt"):
        await _refused(u.files.read(path), path.replace("//", "/"))
        await _refused(u.files.stat(path), path.replace("//", "/"))
    for path in ("/grader/secret.txt", "/grader/new.txt"):
        await _refused(u.files.write(path, b"forged"), path)
    await _refused(u.files.list("/grader"), "/grader")
    await _refused(u.files.remove("/grader/secret.txt"), "/grader/secret.txt")
    await _refused(u.files.remove("/grader", recursive=True), "/grader")
    await _refused(u.files.download_tar("/grader"), "/grader")
    await _refused(u.files.download_tar("/"), "/grader")
    await _refused(u.files.upload_tar(_tar("planted.txt", b"x"), "/grader"), "/grader")
    for link, target, via in LINKS:
        r = await u.exec(f"ln -s {target} {link}", timeout=60)
        assert r.exit_code == 0, r
        await _refused(u.files.read(via), via)
        await _refused(u.files.write(via, b"forged"), via)
        await _refused(u.files.download_tar(via), via)
        if via != link:  # through a directory link: the entry itself is protected
            await _refused(u.files.stat(via), via)
            await _refused(u.files.remove(via), via)
            await _refused(u.files.list(via.rsplit("/", 1)[0]), via.rsplit("/", 1)[0])


def _linking_tar(name: str, target: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        ti = tarfile.TarInfo(name)
        ti.type, ti.linkname = tarfile.LNKTYPE, target
        tf.addfile(ti)
    return buf.getvalue()


async def _grading_links(u, g) -> None:
    """Hard links the grading identity makes: one beside a protected file (allowed) is
    refused to the user's files API; one across directories, by a grading exec or by a
    tar upload's link entry, is not made at all."""
    r = await g.exec("ln /repo/hidden.sh /repo/h2 && ln /grader/secret.txt /tmp/gl",
                     grading=True, timeout=60)
    assert r.exit_code != 0 and "cross-device" in r.stderr, r
    with pytest.raises(dsec.DSecError):
        await g.files.upload_tar(_linking_tar("tmp/tl", "grader/secret.txt"), "/")
    await _refused(u.files.read("/repo/h2"), "/repo/h2")
    for path in ("/tmp/gl", "/tmp/tl"):
        with pytest.raises(dsec.NotFound):
            await u.files.read(path)
    assert await g.files.read("/repo/h2") == SECRET


@pytest.mark.parametrize("backend", ["microvm", "vm"])
async def test_guest_files_api_keeps_a_user_out_of_protected_paths(guest_server, backend):
    tokens = await _tokens(guest_server)
    async with dsec.AsyncClient(guest_server.url, tokens["user"], timeout=300) as uc, \
            dsec.AsyncClient(guest_server.url, tokens["grader"], timeout=300) as gc:
        u = await uc.create(backend=backend, memory_mb=256,
                            protected_paths=["/grader", "/repo/hidden.sh"])
        try:
            g = await gc.get(u.id)
            await g.files.write("/grader/secret.txt", SECRET)  # the grader's files API writes
            await g.files.write("/repo/hidden.sh", SECRET)
            await _user_attacks(u)
            await _grading_links(u, g)
            assert await g.files.read("/grader/secret.txt") == SECRET
            assert [e.name for e in await g.files.list("/grader")] == ["secret.txt"]
            assert (await g.files.stat("/grader/secret.txt")).size == len(SECRET)
            await g.files.write("/grader/secret.txt", b"graded\n")
            assert await g.files.read("/grader/secret.txt") == b"graded\n"
            await u.files.write("/tmp/ok.txt", b"ok")  # the rest stays open to the user
            assert await u.files.read("/tmp/ok.txt") == b"ok"
        finally:
            await u.stop()


@pytest.fixture
async def linked_layer(guest_server, tmp_path):
    """A layer whose /srv/h (and /srv/d/h2) is a hard link to its /grader/secret.txt."""
    from dsec.images import ImageService
    images = ImageService(guest_server.state_dir)
    tag = await import_linked_layer(images, tmp_path / "layer", "pg", SECRET)
    yield tag
    images.untag(tag)  # a guest-only node serves no image routes


@pytest.mark.parametrize("backend", ["microvm", "vm"])
async def test_a_guest_image_giving_a_protected_file_another_name_is_refused(
        guest_server, linked_layer, backend):
    """Refused at create, before a disk is built or a guest boots: agent commands (and the
    files API, whose guest commands are agent commands) would read it by the other name."""
    async with dsec.AsyncClient(guest_server.url, guest_server.token, timeout=300) as c:
        for _ in range(2):  # the second answer is the one the node remembered
            with pytest.raises(dsec.InvalidArgument,
                               match="protected file /grader/secret.txt 2 more name"):
                await c.create(backend=backend, image="busybox", layers=[linked_layer],
                               memory_mb=256, protected_paths=["/grader"])
        assert await c.list() == []
