"""Layered images seen from sandboxes: pack_diff, composition, shared read-only layers."""

import asyncio
import tarfile

import pytest

import dsec


async def test_pack_diff_then_create_sees_the_packed_state(client):
    sb = await client.create(memory_mb=64)
    try:
        await sb.exec("mkdir -p /repo && echo v1 > /repo/a && rm /bin/vi && echo tmp > /tmp/junk")
        img = await sb.pack_diff("workspace/test-repo:v1", exclude=["/tmp/junk"])
        assert img.layers == 2 and img.name.startswith("workspace/test-repo")
        assert (await sb.exec("echo still running")).exit_code == 0
    finally:
        await sb.stop()
    child = await client.create(image="workspace/test-repo:v1", memory_mb=64)
    try:
        r = await child.exec("cat /repo/a; ls /bin/vi; ls /tmp/junk; ls /.dsec")
        assert r.stdout.startswith("v1\n")
        assert "/bin/vi" in r.stderr and "/tmp/junk" in r.stderr, "deletions and excludes kept"
        assert "agent" in r.stdout, "only the node's own bind mounts are at /.dsec"
    finally:
        await child.stop()


async def test_pack_diff_keeps_a_deep_tree(client):
    sb = await client.create(memory_mb=64)
    try:  # 1500 levels: past Python's recursion limit, within PATH_MAX on the host
        r = await sb.exec("mkdir /deep && cd /deep && i=0; while [ $i -lt 1500 ]; do "
                          "mkdir d && cd d || exit 1; i=$((i+1)); done; echo x > f")
        assert r.exit_code == 0, r.stderr
        await sb.pack_diff("workspace/deep:v1")
    finally:
        await sb.stop()
    child = await client.create(image="workspace/deep:v1", memory_mb=64)
    try:
        r = await child.exec("find /deep -name f | wc -l; find /deep -type d | wc -l")
        assert r.stdout.split() == ["1", "1501"]
    finally:
        await child.stop()


async def test_extra_layers_stack_at_create_time(client, server, tmp_path):
    from dsec.images import ImageService
    root = tmp_path / "toolkit"
    (root / "opt" / "toolkit").mkdir(parents=True)
    (root / "opt" / "toolkit" / "run.sh").write_text("echo toolkit v3\n")
    svc = ImageService(server.state_dir)
    await asyncio.to_thread(svc.import_rootfs, root, "toolkit/harness:v3")
    sb = await client.create(image="busybox", layers=["toolkit/harness:v3"], memory_mb=64)
    try:
        assert (await sb.exec("sh /opt/toolkit/run.sh")).stdout == "toolkit v3\n"
        assert (await sb.exec("ls /bin/sh")).exit_code == 0, "base layer still below"
    finally:
        await sb.stop()


async def test_overwriting_a_system_binary_stays_in_one_sandbox(client):
    a, b = await client.create(memory_mb=64), await client.create(memory_mb=64)
    try:
        await a.exec("rm /bin/ls; echo 'echo hacked' > /bin/ls; chmod +x /bin/ls")
        assert (await a.exec("/bin/ls")).stdout == "hacked\n"
        assert (await b.exec("/bin/ls /")).stdout != "hacked\n"
        c = await client.create(memory_mb=64)
        assert "hacked" not in (await c.exec("/bin/ls /")).stdout
        await c.stop()
    finally:
        await asyncio.gather(a.stop(), b.stop())


async def test_hostile_layer_tar_named_in_the_error(server, tmp_path):
    from dsec.images import ImageService
    bad = tmp_path / "bad.tar"
    with tarfile.open(bad, "w") as tf:
        ti = tarfile.TarInfo("../../escape")
        tf.addfile(ti)
    with pytest.raises(dsec.InvalidArgument, match="escape"):
        ImageService(server.state_dir).import_rootfs(bad, "bad:1")


async def test_a_packed_tag_can_be_stacked_as_an_extra_layer(client):
    sb = await client.create(memory_mb=64)
    try:
        await sb.exec("echo packed > /packed.txt")
        await sb.pack_diff("workspace/stackable:v1")
    finally:
        await sb.stop()
    child = await client.create(image="busybox", layers=["workspace/stackable:v1"], memory_mb=64)
    try:
        assert (await child.exec("cat /packed.txt")).stdout == "packed\n"
    finally:
        await child.stop()
