"""Files API: confined to the sandbox root, streamed, tar in and out."""

import io
import os
import tarfile

import pytest

import dsec


async def test_write_read_stat_list_mkdir_remove(sandbox):
    await sandbox.files.mkdir("/workspace/sub")
    info = await sandbox.files.write("/workspace/sub/a.txt", b"hello", mode=0o600)
    assert info.size == 5 and info.mode == 0o600 and info.type == "file"
    assert await sandbox.files.read("/workspace/sub/a.txt") == b"hello"
    assert [e.name for e in await sandbox.files.list("/workspace/sub")] == ["a.txt"]
    assert (await sandbox.exec("cat /workspace/sub/a.txt")).stdout == "hello"
    await sandbox.files.remove("/workspace", recursive=True)
    with pytest.raises(dsec.NotFound):
        await sandbox.files.stat("/workspace/sub/a.txt")


async def test_dotdot_stays_inside(sandbox):
    await sandbox.files.write("/../../../../etc/dsec-escape", b"x")
    assert not os.path.exists("/etc/dsec-escape")
    assert (await sandbox.exec("cat /etc/dsec-escape")).stdout == "x"


async def test_absolute_symlink_resolves_inside(sandbox):
    await sandbox.exec("ln -s /etc/passwd /tmp/link; ln -s ../../../../../etc /tmp/up")
    data = await sandbox.files.read("/tmp/link")
    assert data == (await sandbox.exec("cat /etc/passwd")).stdout.encode()
    with open("/etc/passwd", "rb") as f:
        assert data != f.read()
    await sandbox.files.write("/tmp/up/dsec-through-link", b"y")
    assert not os.path.exists("/etc/dsec-through-link")


async def test_missing_file_is_not_found(sandbox):
    with pytest.raises(dsec.NotFound):
        await sandbox.files.read("/nope")


async def test_tar_round_trip(sandbox, tmp_path):
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "f.txt").write_text("content")
    os.symlink("d/f.txt", src / "link")
    assert await sandbox.files.upload_dir(src, "/up") >= 3
    assert (await sandbox.exec("cat /up/d/f.txt; readlink /up/link")).stdout == "contentd/f.txt\n"
    n = await sandbox.files.download_dir("/up", tmp_path / "back")
    assert n >= 3 and (tmp_path / "back" / "up" / "d" / "f.txt").read_text() == "content"


def _tar(name: str, data: bytes = b"x", **kw) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        ti = tarfile.TarInfo(name)
        ti.size = len(data)
        for k, v in kw.items():
            setattr(ti, k, v)
        tf.addfile(ti, io.BytesIO(data) if ti.isfile() else None)
    return buf.getvalue()


@pytest.mark.parametrize("name,kw,why", [
    ("../evil", {}, "escapes"),
    ("/abs", {}, "escapes"),
    ("dev", {"type": tarfile.CHRTYPE, "devmajor": 1, "devminor": 3}, "device"),
])
async def test_hostile_tar_entries_are_named(sandbox, name, kw, why):
    with pytest.raises(dsec.InvalidArgument, match=why) as exc:
        await sandbox.files.upload_tar(_tar(name, **kw), "/x")
    assert name.strip("/") in str(exc.value)


async def test_setuid_bit_is_dropped(sandbox):
    await sandbox.files.upload_tar(_tar("suid", b"#!/bin/sh\n", mode=0o4755), "/x")
    assert (await sandbox.files.stat("/x/suid")).mode == 0o755


async def test_large_file_streams(sandbox, tmp_path):
    big = tmp_path / "big"
    with open(big, "wb") as f:
        f.truncate(200 << 20)
        f.seek(100 << 20)
        f.write(b"marker")
    s = await client_upload(sandbox, big)
    assert s.size == 200 << 20
    r = await sandbox.exec("dd if=/data/big bs=1 skip=104857600 count=6 2>/dev/null")
    assert r.stdout == "marker"
    out = tmp_path / "out"
    assert await sandbox.files.download("/data/big", out) == 200 << 20
    await sandbox.files.remove("/data/big")


async def client_upload(sandbox, path):
    await sandbox.files.mkdir("/data")
    return await sandbox.files.upload(path, "/data/big")


DEEP = 1500  # past Python's recursion limit (1000); the shell nests one level per mkdir


async def _make_deep(sandbox, top: str) -> None:
    r = await sandbox.exec(f"mkdir -p {top} && cd {top} && i=0; while [ $i -lt {DEEP} ]; do "
                           "mkdir d && cd d || exit 1; i=$((i+1)); done; echo x > f")
    assert r.exit_code == 0, r.stderr


async def test_deep_tree_downloads_as_tar(sandbox):
    await _make_deep(sandbox, "/tmp/deep")
    data = await sandbox.files.download_tar("/tmp/deep")
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        names = tf.getnames()
    assert len(names) == DEEP + 2
    assert names[-1] == "deep/" + "d/" * DEEP + "f"


async def test_deep_tree_removes_recursively(sandbox):
    await _make_deep(sandbox, "/tmp/deep")
    await sandbox.files.remove("/tmp/deep", recursive=True)
    assert not await sandbox.files.exists("/tmp/deep")


def _upper(server, sandbox):
    """The sandbox's writable layer on the host: where a file the API wrote would land."""
    found = list(server.state_dir.glob(f"**/sandboxes/{sandbox.id}/rw/upper"))
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize("op,path", [
    ("write", "/proc/sysrq-trigger"),
    ("write", "/dev/null"),
    ("write", "/sys/dsec-x"),
    ("read", "/proc/self/status"),
    ("list", "/proc"),
    ("stat", "/dev"),
    ("mkdir", "/sys/dsec-x"),
    ("download_tar", "/proc/self"),
    ("write", "/tmp/../proc/dsec-x"),
])
async def test_kernel_filesystems_are_refused(server, sandbox, op, path):
    args = (path, b"x") if op == "write" else (path,)
    with pytest.raises(dsec.InvalidArgument, match="use exec") as exc:
        await getattr(sandbox.files, op)(*args)
    assert "kernel or device filesystems" in str(exc.value)
    upper = _upper(server, sandbox)
    assert not any((upper / top).exists() for top in ("proc", "sys", "dev"))


async def test_kernel_filesystems_through_symlinks_are_refused(server, sandbox):
    r = await sandbox.exec("ln -s /proc /tmp/p && ln -s /dev/null /tmp/n && "
                           "ln -s ../sys /tmp/s && ln -s /proc/dsec-new /tmp/dangling")
    assert r.exit_code == 0, r.stderr
    for op, path in [("write", "/tmp/p/sysrq-trigger"), ("write", "/tmp/n"),
                     ("write", "/tmp/dangling"), ("read", "/tmp/p/self/status"),
                     ("list", "/tmp/s"), ("mkdir", "/tmp/s/x"), ("stat", "/tmp/p/self"),
                     ("download_tar", "/tmp/p/self"), ("remove", "/tmp/p/self")]:
        args = (path, b"x") if op == "write" else (path,)
        with pytest.raises(dsec.InvalidArgument, match="use exec"):
            await getattr(sandbox.files, op)(*args)
    upper = _upper(server, sandbox)
    assert not any((upper / top).exists() for top in ("proc", "sys", "dev"))
    assert (await sandbox.files.stat("/tmp/p")).type == "symlink"  # the link itself is a file


@pytest.mark.parametrize("entries,dest", [
    ([("proc/sysrq-trigger", {})], "/"),
    ([("ok", {}), ("dev/dsec-x", {})], "/"),
    ([("p", {"type": tarfile.SYMTYPE, "linkname": "/proc"}), ("p/dsec-x", {})], "/tmp/t"),
    ([("x", {})], "/sys"),
])
async def test_tar_upload_into_kernel_filesystems_is_refused(server, sandbox, entries, dest):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, kw in entries:
            ti = tarfile.TarInfo(name)
            ti.size = 1 if not kw else 0
            for k, v in kw.items():
                setattr(ti, k, v)
            tf.addfile(ti, io.BytesIO(b"x") if ti.isfile() else None)
    with pytest.raises(dsec.InvalidArgument, match="use exec"):
        await sandbox.files.upload_tar(buf.getvalue(), dest)
    upper = _upper(server, sandbox)
    assert not any((upper / top).exists() for top in ("proc", "sys", "dev"))


async def test_dev_shm_is_the_sandbox_tmpfs(sandbox):
    r = await sandbox.exec("echo made > /dev/shm/made && mkdir /dev/shm/d && "
                           "ln -s /etc/hostname /dev/shm/link")
    assert r.exit_code == 0, r.stderr
    assert await sandbox.files.read("/dev/shm/made") == b"made\n"
    await sandbox.files.write("/dev/shm/d/put", b"put")
    assert (await sandbox.exec("cat /dev/shm/d/put")).stdout == "put"
    assert (await sandbox.files.stat("/dev/shm")).type == "dir"
    names = [e.name for e in await sandbox.files.list("/dev/shm")]
    assert names == ["d", "link", "made"]
    with tarfile.open(fileobj=io.BytesIO(await sandbox.files.download_tar("/dev/shm"))) as tf:
        assert "shm/d/put" in tf.getnames()
    await sandbox.files.upload_tar(_tar("up.txt", b"up"), "/dev/shm/d")
    assert (await sandbox.exec("cat /dev/shm/d/up.txt")).stdout == "up"
    with pytest.raises(dsec.InvalidArgument, match="symlink"):
        await sandbox.files.read("/dev/shm/link")  # not followed there: use exec
    await sandbox.files.remove("/dev/shm/d", recursive=True)
    assert (await sandbox.exec("ls /dev/shm")).stdout.split() == ["link", "made"]
    with pytest.raises(dsec.InvalidArgument):
        await sandbox.files.remove("/dev/shm", recursive=True)
