"""Dockerfile builds: checks of our own (pure), then real builds with buildah."""

from __future__ import annotations

import os

import pytest

from dsec.api.errors import InvalidArgument
from dsec.images import ImageService
from dsec.images.dockerfile import DockerfileError, check_context, parse_dockerfile
from dsec.images.registry import RegistryAuth
from tests.images.conftest import overlay
from tests.support.registry import run_registry


def test_unknown_instruction_names_the_line():
    with pytest.raises(DockerfileError, match=r"line 3: unknown instruction 'FROB'"):
        parse_dockerfile("FROM busybox\n# c\nFROB x\n")


def test_continuations_and_comments():
    got = parse_dockerfile("FROM busybox\nRUN echo a \\\n  # note\n  && echo b\nENV A=1\n")
    assert [(i.keyword, i.line) for i in got] == [("FROM", 1), ("RUN", 2), ("ENV", 5)]
    assert "echo a" in got[1].args and "echo b" in got[1].args


@pytest.mark.parametrize("line", ["COPY ../secret /x", "ADD ../../etc/passwd /x",
                                  "COPY ./a/../../b /x", 'COPY ["../s", "/x"]'])
def test_copy_from_outside_the_context_is_refused(tmp_path, line):
    (tmp_path / "a").mkdir()
    with pytest.raises(DockerfileError, match=r"line 2: .*outside the build context"):
        check_context(parse_dockerfile(f"FROM busybox\n{line}\n"), tmp_path)


def test_copy_through_a_symlink_out_of_the_context_is_refused(tmp_path):
    os.symlink("/etc", tmp_path / "sneaky")
    with pytest.raises(DockerfileError, match="outside the build context"):
        check_context(parse_dockerfile("FROM busybox\nCOPY sneaky/passwd /x\n"), tmp_path)


def test_add_of_a_url_is_refused(tmp_path):
    with pytest.raises(DockerfileError, match="no network"):
        check_context(parse_dockerfile("FROM busybox\nADD https://example.org/a /a\n"), tmp_path)


def test_copy_inside_the_context_and_from_a_stage_pass(tmp_path):
    (tmp_path / "src").mkdir()
    check_context(parse_dockerfile("FROM busybox AS b\nCOPY src/ /src/\nCOPY *.txt /\n"
                                   "FROM busybox\nCOPY --from=b /etc/passwd /p\n"), tmp_path)


DOCKERFILE = """\
FROM busybox AS tools
RUN echo built-in-stage > /stage.txt

FROM busybox
ARG GREETING=hello
ENV APP_HOME=/app MODE=test
WORKDIR /app
COPY app.py requirements.txt ./
COPY --from=tools /stage.txt /opt/stage.txt
RUN echo "$GREETING from RUN" > /app/run.txt && ls /sys/class/net > /app/nets.txt \\
    && rm /bin/vi
LABEL org.example.kind=test
USER 1000:1000
CMD ["python", "app.py"]
"""


def _context(tmp_path):
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(DOCKERFILE)
    (ctx / "app.py").write_text("print('hi')\n")
    (ctx / "requirements.txt").write_text("pytest\n")
    return ctx


def test_build_runs_every_instruction_without_network(svc, busybox, tmp_path):
    ctx = _context(tmp_path)
    info = svc.build_dockerfile(ctx / "Dockerfile", "team/app:v1",
                                build_args={"GREETING": "hey"})
    m = svc.manifest("team/app:v1")
    base = svc.manifest("busybox").layers
    assert m.layers[:len(base)] == base  # the base is the dsec image's own layer, not a copy
    assert info.layers == len(m.layers) > len(base)
    cfg = m.config
    assert cfg.env["APP_HOME"] == "/app" and cfg.env["MODE"] == "test"
    assert cfg.cwd == "/app" and cfg.user == "1000:1000"
    assert cfg.entrypoint == ["python", "app.py"] and cfg.labels["org.example.kind"] == "test"
    with overlay(tmp_path, svc.resolve("team/app:v1").lowerdirs, writable=False) as (root, _):
        assert (root / "app/app.py").read_text() == "print('hi')\n"
        assert (root / "app/run.txt").read_text() == "hey from RUN\n"
        assert (root / "app/nets.txt").read_text() == "lo\n"  # RUN saw loopback only
        assert (root / "opt/stage.txt").read_text() == "built-in-stage\n"
        assert not (root / "bin/vi").exists()  # the deletion is a whiteout over the base
        assert (root / "bin/sh").exists()
    assert not list(svc.store.tmp.iterdir())


def test_failing_run_step_is_a_build_error_and_leaves_nothing(svc, busybox, tmp_path):
    (tmp_path / "Dockerfile").write_text("FROM busybox\nRUN exit 3\n")
    with pytest.raises(DockerfileError, match="buildah exit"):
        svc.build_dockerfile(tmp_path / "Dockerfile", "team/bad:v1")
    assert svc.store.get_tag("team/bad:v1") is None and not list(svc.store.tmp.iterdir())


def test_from_a_registry_image(svc, busybox, tmp_path):
    with run_registry(tmp_path / "reg") as reg:
        auth = RegistryAuth(insecure=True)
        svc.push_registry("busybox", reg.ref("base/bb:1"), auth)
        fresh_tag = reg.ref("base/bb:1")
        (tmp_path / "Dockerfile").write_text(f"FROM {fresh_tag}\nRUN echo ok > /ok\n")
        svc.build_dockerfile(tmp_path / "Dockerfile", "team/fromreg:v1", auth=auth)
    with overlay(tmp_path, svc.resolve("team/fromreg:v1").lowerdirs, writable=False) as (r, _):
        assert (r / "ok").read_text() == "ok\n"


def test_unknown_from_image_is_an_error_naming_it(svc, tmp_path):
    (tmp_path / "Dockerfile").write_text("FROM 127.0.0.1:1/none/such:v1\nRUN true\n")
    with pytest.raises(Exception, match="none/such"):
        svc.build_dockerfile(tmp_path / "Dockerfile", "team/x:v1",
                             auth=RegistryAuth(insecure=True))
    assert not list(svc.store.tmp.iterdir())


def test_invalid_argument_root(tmp_path):
    assert issubclass(DockerfileError, InvalidArgument)


# ---- heredocs and the escape directive (buildah 1.28 has neither heredocs nor their
# ---- parsing: dsec lowers them, see dsec.images.heredoc)
def test_heredoc_bodies_belong_to_their_instruction():
    got = parse_dockerfile("FROM busybox\nRUN <<EOF\necho a\nFROB x\nEOF\nENV A=1\n")
    assert [(i.keyword, i.line, i.end) for i in got] == [("FROM", 1, 1), ("RUN", 2, 5),
                                                          ("ENV", 6, 6)]
    assert got[1].heredocs == ("echo a\nFROB x",)


def test_unclosed_heredoc_names_the_line():
    with pytest.raises(DockerfileError, match=r"line 2: heredoc <<EOF is never closed"):
        parse_dockerfile("FROM busybox\nRUN <<EOF\necho a\n")


def test_escape_directive_changes_the_continuation_character():
    got = parse_dockerfile("# escape=`\nFROM busybox\nRUN echo a `\n  && echo b\n"
                           "ENV P=C:\\\nENV Q=1\n")
    assert [i.keyword for i in got] == ["FROM", "RUN", "ENV", "ENV"]
    assert "echo a" in got[1].args and "echo b" in got[1].args
    with pytest.raises(DockerfileError, match="backslash or a backtick"):
        parse_dockerfile("# escape=x\nFROM busybox\n")


def test_copy_heredoc_is_no_context_path(tmp_path):
    check_context(parse_dockerfile("FROM busybox\nCOPY <<EOF /etc/x\nhi\nEOF\n"), tmp_path)


def test_copy_heredoc_mixed_with_files_is_refused(svc, busybox, tmp_path):
    (tmp_path / "a").write_text("a")
    (tmp_path / "Dockerfile").write_text("FROM busybox\nCOPY a <<EOF /d/\nhi\nEOF\n")
    with pytest.raises(DockerfileError, match="line 2: COPY mixes heredocs with files"):
        svc.build_dockerfile(tmp_path / "Dockerfile", "team/hd:v1")
    assert not list(svc.store.tmp.iterdir())


HEREDOCS = """\
FROM busybox
ARG WHO=world
RUN <<EOF
echo "one $WHO" > /one.txt
echo two >> /one.txt
EOF
RUN cat <<'A' > /two.txt && wc -l < /two.txt > /count.txt
x $NOT_EXPANDED
y
A
COPY --chmod=0600 <<EOF /etc/app.conf
mode=test
EOF
COPY <<C1 <<C2 /etc/dir/
c one
C1
c two
C2
"""


def test_heredocs_run_and_copy(svc, busybox, tmp_path):
    (tmp_path / "Dockerfile").write_text(HEREDOCS)
    svc.build_dockerfile(tmp_path / "Dockerfile", "team/hd:v1")
    with overlay(tmp_path, svc.resolve("team/hd:v1").lowerdirs, writable=False) as (r, _):
        assert (r / "one.txt").read_text() == "one world\ntwo\n"
        assert (r / "two.txt").read_text() == "x $NOT_EXPANDED\ny\n"
        assert (r / "count.txt").read_text().strip() == "2"
        assert (r / "etc/app.conf").read_text() == "mode=test\n"
        assert (r / "etc/app.conf").stat().st_mode & 0o777 == 0o600
        assert (r / "etc/dir/C1").read_text() == "c one\n"
        assert (r / "etc/dir/C2").read_text() == "c two\n"
    assert not list(svc.store.tmp.iterdir())


ESCAPED = """\
# escape=`
FROM busybox
RUN echo one > /p.txt `
    && echo joined >> /p.txt
"""


def test_escape_directive_is_honoured_by_the_build(svc, busybox, tmp_path):
    # Without the directive the backtick would end the RUN and '&&' be an instruction.
    (tmp_path / "Dockerfile").write_text(ESCAPED)
    svc.build_dockerfile(tmp_path / "Dockerfile", "team/esc:v1")
    with overlay(tmp_path, svc.resolve("team/esc:v1").lowerdirs, writable=False) as (r, _):
        assert (r / "p.txt").read_text() == "one\njoined\n"


@pytest.mark.parametrize("state", ["state_", "State__x", "a b"])
def test_a_state_dir_whose_path_is_no_image_name_still_builds(tmp_path, state):
    """buildah names an image read from ``oci:DIR`` after DIR; a path that is no valid
    image name (mkdtemp's ``_`` at the end of a component, capitals, spaces) must not
    break a build (CI lost a run to a temporary directory ending in ``_``)."""
    service = ImageService(tmp_path / state)
    try:
        service.ensure_busybox()
        (tmp_path / "Dockerfile").write_text("FROM busybox\nRUN echo ok > /ok\n")
        service.build_dockerfile(tmp_path / "Dockerfile", "team/odd:v1")
        with overlay(tmp_path, service.resolve("team/odd:v1").lowerdirs,
                     writable=False) as (root, _):
            assert (root / "ok").read_text() == "ok\n"
        assert not list(service.store.tmp.iterdir())
    finally:
        service.unmount_all()
