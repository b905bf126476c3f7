"""dsec create / ls / exec / rm against a real server."""

from __future__ import annotations

import signal
import subprocess
import time

from tests.cli.conftest import DSEC, one_error_line, run_cli
from tests.cli.terminal import Terminal
from tests.support.server import free_port


def test_create_count_ls_and_rm_by_job(cli, job, sync_client):
    r = cli("create", "--count", "3", "--job", job, "--label", "team=rl", "--memory-mb", "128",
            "--cpu", "1")
    assert r.returncode == 0, r.stderr
    ids = r.stdout.split()
    assert len(ids) == 3 and all(i.startswith("sb-") for i in ids)
    assert {i.id for i in sync_client.list(job=job)} == set(ids)

    table = cli("ls", "--job", job)
    assert table.returncode == 0, table.stderr
    assert table.stdout.split()[:8] == ["ID", "BACKEND", "IMAGE", "STATE", "CPU", "MEMORY",
                                        "JOB", "AGE"]
    rows = [ln.split() for ln in table.stdout.splitlines()[1:]]
    assert {row[0] for row in rows} == set(ids)
    for row in rows:
        assert row[1:8] == ["container", "busybox", "running", "1", "128", "MiB", job]

    assert set(cli("ls", "-q", "--label", "team=rl", "--job", job).stdout.split()) == set(ids)
    assert cli("ls", "-q", "--label", "team=other", "--job", job).stdout.split() == []

    r = cli("rm", "--job", job)
    assert r.returncode == 0, r.stderr
    assert "stopped 3 sandboxes" in r.stderr
    assert sync_client.list(job=job) == []


def test_create_count_shows_a_progress_bar_on_a_terminal(env, job, sync_client):
    t = Terminal([*DSEC, "create", "--count", "3", "--job", job, "--memory-mb", "64"], env)
    try:
        assert t.wait() == 0, t.buf
    finally:
        t.close()
    ids = {i.id for i in sync_client.list(job=job)}
    assert len(ids) == 3
    assert b"creating" in t.buf and b"3/3" in t.buf  # the bar, advanced once per sandbox
    assert all(i.encode() in t.buf for i in ids)


def test_rm_by_id(cli, sb, sync_client, job):
    r = cli("rm", sb.id)
    assert (r.returncode, r.stdout.split()) == (0, [sb.id])
    assert sync_client.list(job=job) == []


def test_bad_arguments_are_one_red_line(cli, job, sync_client):
    r = cli("create", "--memory-mb", "4", "--job", job)
    assert r.returncode == 1
    assert "memory_mb must be between 16 and 65536; got 4" in one_error_line(r.stderr)
    assert sync_client.list(job=job) == []


def test_unknown_sandbox(cli):
    for args in (["exec", "sb-00000000-000000000000", "--", "true"],
                 ["rm", "sb-00000000-000000000000"]):
        r = cli(*args)
        assert r.returncode == 1
        assert one_error_line(r.stderr) == "error: sandbox sb-00000000-000000000000 not found"


def test_wrong_token_and_no_server(env):
    r = run_cli({**env, "DSEC_TOKEN": "wrong"}, "ls")
    assert r.returncode == 1
    assert "bearer token" in one_error_line(r.stderr)
    r = run_cli({**env, "DSEC_URL": f"http://127.0.0.1:{free_port()}"}, "ls")
    assert r.returncode == 1
    assert "cannot reach the dsec server" in one_error_line(r.stderr)


def test_a_refused_token_says_where_it_came_from(env, tmp_path):
    url = env["DSEC_URL"]
    r = run_cli({**env, "DSEC_TOKEN": "wrong"}, "ls")
    assert one_error_line(r.stderr) == (
        "error: missing or wrong bearer token; the token came from DSEC_TOKEN: set "
        f"DSEC_TOKEN to a token of the server at {url}")
    (tmp_path / "token").write_text("wrong\n")
    local = {k: v for k, v in env.items() if k != "DSEC_TOKEN"}
    r = run_cli({**local, "DSEC_STATE_DIR": str(tmp_path)}, "ls")
    assert one_error_line(r.stderr) == (
        f"error: missing or wrong bearer token; the token came from {tmp_path}/token "
        f"(DSEC_TOKEN is not set): set DSEC_TOKEN to a token of the server at {url}")
    r = run_cli({**local, "DSEC_STATE_DIR": str(tmp_path / "none")}, "ls")
    assert one_error_line(r.stderr).startswith(
        f"error: missing or wrong bearer token; no token: DSEC_TOKEN is not set and "
        f"{tmp_path}/none/token cannot be read; set DSEC_TOKEN")


def test_exec_streams_and_exit_code(cli, sb):
    r = cli("exec", sb.id, "--", "echo hi; echo err >&2; exit 3")
    assert (r.returncode, r.stdout, r.stderr) == (3, "hi\n", "err\n")
    r = cli("exec", sb.id, "--", "sh", "-c", "echo $0-$1; exit 7", "a b", "c")
    assert (r.returncode, r.stdout) == (7, "a b-c\n")
    r = cli("exec", sb.id, "ls", "-d", "/etc")  # no `--` needed either
    assert (r.returncode, r.stdout) == (0, "/etc\n")
    assert cli("exec", sb.id, "--", "no-such-program").returncode == 127


def test_exec_stdin_env_and_workdir(cli, sb):
    r = cli("exec", "-i", "-e", "X=1", "-w", "/etc", sb.id, "--", "tr a-z A-Z; echo $X; pwd",
            input="hello\n")
    assert (r.returncode, r.stdout) == (0, "HELLO\n1\n/etc\n")


def test_exec_timeout_exits_124(cli, sb):
    r = cli("exec", "--timeout", "1", sb.id, "--", "echo started; sleep 60")
    assert r.returncode == 124
    assert r.stdout == "started\n"
    assert "timed out after 1s" in one_error_line(r.stderr)


def test_exec_output_arrives_while_the_command_runs(env, sb):
    proc = subprocess.Popen([*DSEC, "exec", "--timeout", "60", sb.id, "--",
                             "echo first; sleep 60"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "first\n"
        assert proc.poll() is None  # still running: the line was streamed, not buffered
    finally:
        proc.kill()
        proc.wait()


def test_ctrl_c_stops_the_remote_command(env, sb):
    # Ctrl-C as a terminal sends it. A runner started in the background (`cmd &` in a
    # script) hands its children SIGINT ignored, and a Python started so never hears it.
    proc = subprocess.Popen([*DSEC, "exec", sb.id, "--", "echo started; exec sleep 3600"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_sigint_default)
    assert proc.stdout.readline() == "started\n"
    assert "sleep 3600" in sb.exec("ps -o args").stdout
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 130
    assert proc.stderr.read() == "interrupted\n"
    deadline = time.monotonic() + 60  # the server kills it when the stream closes
    while "sleep 3600" in sb.exec("ps -o args").stdout:
        assert time.monotonic() < deadline, "the command outlived its dsec exec"
        time.sleep(0.1)


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
