"""build: a spec file's steps run on a base; the result is packed and tagged."""

from __future__ import annotations

import os

import pytest

from dsec.api.errors import InvalidArgument
from dsec.images.build import BuildFailed, BuildSpec, load_spec

from .conftest import mounts_under

SPEC = """
tag = "toolkit/hello:v1"
base = "busybox"
env = { GREETING = "hi" }
workdir = "/workspace"
exclude = ["/root/.ash_history"]
labels = { team = "rl" }
steps = [
  { copy = "hello.sh", to = "/usr/local/bin/hello" },
  { copy = "data", to = "/workspace/data" },
  { run = "chmod 755 /usr/local/bin/hello && hello > /workspace/out.txt" },
  { run = "rm /etc/hostname && echo $GREETING > greeting && cat /proc/self/stat > /dev/null" },
]
"""


@pytest.fixture
def spec_file(tmp_path):
    ctx = tmp_path / "ctx"
    (ctx / "data").mkdir(parents=True)
    (ctx / "data/x.txt").write_text("x")
    (ctx / "hello.sh").write_text("#!/bin/sh\necho hello from $GREETING\n")
    (ctx / "spec.toml").write_text(SPEC)
    return ctx / "spec.toml"


def test_build_runs_steps_and_packs_the_result(svc, busybox, spec_file, tmp_path):
    seen = []
    info = svc.build(spec_file, progress=lambda i, n, text: seen.append((i, n, text)))
    assert [s[:2] for s in seen] == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert seen[0][2] == "COPY hello.sh /usr/local/bin/hello"
    r = svc.resolve("toolkit/hello:v1")
    assert r.layer_digests[-1] == info.digest and len(r.lowerdirs) == 2
    top = r.lowerdirs[0]
    assert (top / "workspace/out.txt").read_text() == "hello from hi\n"
    assert (top / "workspace/greeting").read_text() == "hi\n"
    assert (top / "workspace/data/x.txt").read_text() == "x"
    assert os.lstat(top / "etc/hostname").st_rdev == 0  # whiteout
    assert not (top / "proc/self").exists()
    assert r.config.env["GREETING"] == "hi" and r.config.cwd == "/workspace"
    assert r.config.labels["team"] == "rl"
    assert [m for m in mounts_under(tmp_path) if m[1] == "overlay"] == []
    assert not list(svc.store.tmp.iterdir())


def test_failing_step_names_itself_and_cleans_up(svc, busybox, tmp_path):
    spec = BuildSpec(tag="t/x:1", steps=[{"run": "echo boom; exit 3"}])
    with pytest.raises(BuildFailed, match=r"step 1/1 'echo boom; exit 3' exited with 3: boom"):
        svc.build(spec, context=tmp_path)
    assert [m for m in mounts_under(tmp_path) if m[1] == "overlay"] == []
    assert not list(svc.store.tmp.iterdir())
    assert "t/x:latest" not in {i.name for i in svc.list_images()}


def test_steps_have_no_network_by_default(svc, busybox, tmp_path):
    spec = BuildSpec(tag="t/net:1", steps=[{"run": "ip link > /links 2>&1 || ifconfig -a > /links"}])
    svc.build(spec, context=tmp_path)
    links = (svc.resolve("t/net:1").lowerdirs[0] / "links").read_text()
    host = {line.split(":")[1].strip() for line in os.popen("ip -o link") if ":" in line}
    assert "lo" in links
    assert not [name for name in host - {"lo"} if name in links]


def test_copy_outside_the_context_is_refused(svc, busybox, tmp_path):
    (tmp_path / "ctx").mkdir()
    spec = BuildSpec(tag="t/x:1", steps=[{"copy": "../secret", "to": "/s"}])
    (tmp_path / "secret").write_text("s")
    with pytest.raises(InvalidArgument, match="outside the spec's folder"):
        svc.build(spec, context=tmp_path / "ctx")


def test_bad_spec_files(tmp_path):
    (tmp_path / "a.toml").write_text('tag = "x:1"\nsteps = [{ run = "a", copy = "b" }]\n')
    with pytest.raises(InvalidArgument, match="exactly one of"):
        load_spec(tmp_path / "a.toml")
    (tmp_path / "b.toml").write_text('tag = "x:1"\nunknown = 1\n')
    with pytest.raises(InvalidArgument, match="unknown"):
        load_spec(tmp_path / "b.toml")
    with pytest.raises(InvalidArgument, match="does not exist"):
        load_spec(tmp_path / "none.toml")
