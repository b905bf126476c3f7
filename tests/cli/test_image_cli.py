"""dsec image build/import/merge/tag/rm/ls/gc/push: the real command on a node-local store."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

from dsec.api.errors import NotFound
from dsec.images import ImageService, erofs
from dsec.images.build import load_spec
from tests.cli.conftest import one_error_line
from tests.images.tarutil import d, entry, make_tar
from tests.images.test_import import _oci_files, _write_tar

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "images" / "workspace.toml"
EXAMPLE_TAG = "examples/workspace:v1"
_SCRIPT = Path(sys.executable).with_name("dsec")
DSEC = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "dsec.cli"]
DIGEST = r"sha256:[0-9a-f]{64}"


@pytest.fixture(scope="module")
def state_dir():
    """A fresh node state directory for this module; its layer mounts go with it."""
    path = Path(tempfile.mkdtemp(prefix="dsec-imgcli-"))
    yield path
    ImageService(path).unmount_all()
    shutil.rmtree(path)


@pytest.fixture
def svc(state_dir):
    """The store the commands write to; every layer mounted during the test is unmounted."""
    s = ImageService(state_dir)
    yield s
    s.unmount_all()


@pytest.fixture
def image(state_dir, svc):
    """``dsec image ARGS...`` on the module's store; never raises on exit status."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSEC_")}
    env.update(DSEC_STATE_DIR=str(state_dir), COLUMNS="200")

    def run(*args: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([*DSEC, "image", *args], env={**env, **(extra_env or {})},
                              capture_output=True, text=True, timeout=120)
    return run


@pytest.fixture
def built(image, svc):
    """The example spec built (once per module; later calls find its tag)."""
    if svc.store.get_tag(EXAMPLE_TAG) is None:
        r = image("build", str(EXAMPLE))
        assert r.returncode == 0, r.stderr
    return EXAMPLE_TAG


def _printed(stdout: str, key: str) -> str:
    m = re.search(rf"^{key}\s+(\S+)", stdout, re.M)
    assert m, stdout
    return m.group(1)


def _ls(image) -> dict[str, list[str]]:
    r = image("ls")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["NAME", "DIGEST", "LAYERS", "SIZE", "AGE"]
    return {row.split()[0]: row.split()[1:] for row in lines[1:]}


def test_build_shows_each_step_and_tags_the_packed_layer(image, svc):
    r = image("build", str(EXAMPLE), "--tag", "clitest/ws:v1")
    assert r.returncode == 0, r.stderr
    steps = load_spec(EXAMPLE).steps
    for i, step in enumerate(steps, 1):
        assert f"step {i}/{len(steps)}: {step.describe()}" in r.stderr
    layer = _printed(r.stdout, "layer")
    assert re.fullmatch(DIGEST, layer)
    m = svc.manifest("clitest/ws:v1")
    assert m.layers[-1].digest == layer
    assert m.config.env["GREETING"] == "hello from the workspace layer"
    top = svc.resolve("clitest/ws:v1").lowerdirs[0]
    assert (top / "workspace/greeting.txt").read_text() == "hello from the workspace layer\n"


def test_failing_build_step_is_one_error_line(image, svc, tmp_path):
    spec = tmp_path / "bad.toml"
    spec.write_text('tag = "clitest/bad:v1"\nsteps = [{ run = "echo oops; exit 3" }]\n')
    r = image("build", str(spec))
    assert r.returncode == 1
    line = one_error_line(r.stderr.split("\n", 1)[1])  # after the step's progress line
    assert "exited with 3" in line and "oops" in line
    assert svc.store.get_tag("clitest/bad:v1") is None


def test_import_rootfs_tar(image, svc, tmp_path):
    tar = tmp_path / "rootfs.tar.gz"
    tar.write_bytes(make_tar([d("etc"), entry("etc/motd", b"imported\n")], compress=True))
    r = image("import", str(tar), "--tag", "clitest/rootfs:v1", "--base", "busybox",
              "--env", "A=1")
    assert r.returncode == 0, r.stderr
    m = svc.manifest("clitest/rootfs:v1")
    assert m.layers[-1].digest == _printed(r.stdout, "layer")
    assert m.layers[0].digest == svc.manifest("busybox").layers[0].digest
    assert m.config.env["A"] == "1" and "PATH" in m.config.env
    top = svc.resolve("clitest/rootfs:v1").lowerdirs[0]
    assert (top / "etc/motd").read_bytes() == b"imported\n"


@pytest.mark.parametrize("hostile", [
    entry("../../evil", b"x"),
    entry("dev/sda", type=tarfile.CHRTYPE, devmajor=8),
])
def test_import_hostile_tar_names_the_entry(image, svc, tmp_path, hostile):
    tar = tmp_path / "bad.tar"
    tar.write_bytes(make_tar([d("etc"), entry("etc/ok", b"ok"), hostile]))
    r = image("import", str(tar), "--tag", "clitest/hostile:v1")
    assert r.returncode == 1
    assert repr(hostile[0].name) in one_error_line(r.stderr)
    assert svc.store.get_tag("clitest/hostile:v1") is None


def test_import_detects_an_oci_layout(image, svc, tmp_path):
    layout = _write_tar(tmp_path / "oci.tar", _oci_files())
    r = image("import", str(layout), "--tag", "clitest/oci:v1")
    assert r.returncode == 0, r.stderr
    assert _printed(r.stdout, "manifest") == svc.manifest_digest("clitest/oci:v1")
    assert len(svc.manifest("clitest/oci:v1").layers) == 2


def test_tag_ls_rm(image, svc):
    r = image("tag", "busybox", "clitest/bb:v1")
    assert r.returncode == 0, r.stderr
    rows = _ls(image)
    assert rows["clitest/bb:v1"][:2] == rows["busybox:latest"][:2]  # digest, layers
    assert image("rm", "clitest/bb:v1").returncode == 0
    assert "clitest/bb:v1" not in _ls(image)
    r = image("rm", "clitest/bb:v1")
    assert r.returncode == 1
    assert "'clitest/bb:v1' not found" in one_error_line(r.stderr)


def test_merge_squashes_layers_keeping_the_files(image, svc, built):
    r = image("merge", built, "--tag", "clitest/merged:v1")
    assert r.returncode == 0, r.stderr
    assert _ls(image)["clitest/merged:v1"][1] == "1"
    merged = svc.resolve("clitest/merged:v1").lowerdirs
    assert len(merged) == 1 and merged[0] == svc.mounts.path(_printed(r.stdout, "layer"))
    assert (merged[0] / "bin/busybox").is_file()
    assert (merged[0] / "workspace/greeting.txt").is_file()
    r = image("merge", built, "--tag", "clitest/merged:v2", "--start", "2")
    assert r.returncode == 1
    assert "has 2 layers" in one_error_line(r.stderr)


def test_gc_removes_only_untagged_layers(image, svc, built, tmp_path):
    tar = tmp_path / "orphan.tar"
    tar.write_bytes(make_tar([entry("orphan", secrets.token_bytes(16))]))
    r = image("import", str(tar), "--tag", "clitest/orphan:v1")
    assert r.returncode == 0, r.stderr
    orphan = _printed(r.stdout, "layer")
    assert image("rm", "clitest/orphan:v1").returncode == 0
    r = image("gc", "--grace", "0")
    assert r.returncode == 0, r.stderr
    assert re.search(rf"^removed layer\s+{orphan}$", r.stdout, re.M), r.stdout
    assert not svc.store.has_blob(orphan)
    assert all(svc.store.has_blob(lr.digest) for lr in svc.manifest(built).layers)


def test_gc_keeps_layers_a_mounted_overlay_stacks(image, svc, tmp_path):
    tar = tmp_path / "held.tar"
    tar.write_bytes(make_tar([entry("held", secrets.token_bytes(16))]))
    r = image("import", str(tar), "--tag", "clitest/held:v1")
    assert r.returncode == 0, r.stderr
    held = _printed(r.stdout, "layer")
    dirs = {name: tmp_path / name for name in ("upper", "work", "merged")}
    for p in dirs.values():
        p.mkdir()
    erofs.mount_overlay(svc.resolve("clitest/held:v1").lowerdirs, dirs["upper"], dirs["work"],
                        dirs["merged"])  # what a sandbox's root filesystem looks like
    try:
        assert image("rm", "clitest/held:v1").returncode == 0
        r = image("gc", "--grace", "0")
        assert r.returncode == 0, r.stderr
        assert held not in r.stdout and svc.store.has_blob(held)
    finally:
        erofs.umount(dirs["merged"])
    r = image("gc", "--grace", "0")
    assert held in r.stdout and not svc.store.has_blob(held)


def test_push_uploads_to_a_gateway(image, svc, built, server, sync_client):
    tag = f"clitest/pushed:{secrets.token_hex(4)}"
    remote = ImageService(server.state_dir)
    try:
        r = image("push", built, "--to", server.url, "--tag", tag,
                  extra_env={"DSEC_TOKEN": server.token})
        assert r.returncode == 0, r.stderr
        assert {i.name: i.digest for i in sync_client.images()}[tag] == \
            svc.manifest_digest(built)
    finally:
        try:
            remote.untag(tag)
        except NotFound:
            pass
