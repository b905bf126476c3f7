"""dsec image pull / push against a real registry on loopback (docker-registry, skopeo)."""

from __future__ import annotations

import os
import subprocess

import pytest

from dsec.images import ImageService
from tests.cli.test_image_cli import DSEC
from tests.images.tarutil import d, entry, make_tar
from tests.support.registry import make_layout, run_registry, skopeo_copy

LAYER = make_tar([d("etc"), entry("etc/hello", b"hello\n")])


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reg")
    with run_registry(tmp) as reg:
        make_layout(tmp / "layout", [LAYER])
        skopeo_copy(tmp / "layout", reg.ref("team/env:v3"))
        yield reg


@pytest.fixture
def image(tmp_path):
    state = tmp_path / "state"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSEC_")}
    env.update(DSEC_STATE_DIR=str(state), COLUMNS="200")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*DSEC, "image", *args], env=env, capture_output=True,
                              text=True, timeout=120)
    yield run
    ImageService(state).unmount_all()


def test_pull_prints_the_tag_and_a_second_pull_finds_every_layer(image, registry):
    ref = registry.ref("team/env:v3")
    r = image("pull", ref, "--insecure")
    assert r.returncode == 0, r.stderr
    assert f"tag       {ref}" in r.stdout and "lyr-" in r.stderr
    again = image("pull", ref, "--insecure")
    assert again.returncode == 0 and "present" in again.stderr
    assert ref in image("ls").stdout


def test_pull_without_insecure_speaks_https_and_says_so(image, registry):
    r = image("pull", registry.ref("team/env:v3"))
    assert r.returncode != 0
    assert registry.host in r.stderr and "Traceback" not in r.stderr


def test_push_to_a_registry_then_pull_into_another_store(image, registry, tmp_path):
    ref = registry.ref("team/env:v3")
    assert image("pull", ref, "--insecure").returncode == 0
    r = image("push", ref, registry.ref("copies/env:v1"), "--insecure")
    assert r.returncode == 0, r.stderr
    assert f"pushed {registry.ref('copies/env:v1')} -> sha256:" in r.stdout
    out = tmp_path / "layout"
    r = image("export", ref, str(out))
    assert r.returncode == 0 and (out / "index.json").is_file(), r.stderr


def test_build_a_dockerfile_and_refuse_an_unknown_instruction(image, tmp_path):
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "hello.txt").write_text("hi\n")
    (ctx / "Dockerfile").write_text("FROM busybox\nCOPY hello.txt /hello.txt\nRUN cat /hello.txt\n")
    r = image("build", str(ctx / "Dockerfile"), "--tag", "team/cli:v1")
    assert r.returncode == 0, r.stderr
    assert "tag       team/cli:v1" in r.stdout
    (ctx / "Dockerfile").write_text("FROM busybox\nFETCH http://x /y\n")
    r = image("build", str(ctx / "Dockerfile"), "--tag", "team/cli:v2")
    assert r.returncode != 0 and "line 2: unknown instruction 'FETCH'" in r.stderr
    assert "Traceback" not in r.stderr
