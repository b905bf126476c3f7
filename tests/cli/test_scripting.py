"""The CLI for scripts: --json on every listing and result command, --version, shell
completion, and `dsec cp` with `-` for stdin and stdout."""

from __future__ import annotations

import json
import os
import subprocess

import typer.main

import dsec
from dsec.cli.main import app
from tests.cli.conftest import DSEC

# interactive or long-running: nothing to print as a document
NOT_RESULTS = {"serve", "node", "shell", "demo"}


def _commands(group, prefix=()):
    click_group = typer.main.get_command(group) if not hasattr(group, "commands") else group
    for name, cmd in click_group.commands.items():
        if hasattr(cmd, "commands"):
            yield from _commands(cmd, (*prefix, name))
        else:
            yield " ".join((*prefix, name)), cmd


def test_every_result_command_takes_json():
    names = dict(_commands(app))
    assert {"ls", "create", "rm", "exec", "cp", "images", "nodes", "image ls"} <= set(names)
    missing = [n for n, cmd in names.items() if n not in NOT_RESULTS
               and not any("--json" in p.opts for p in cmd.params)]
    assert not missing, f"commands without --json: {missing}"


def test_version(cli):
    r = cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"dsec {dsec.__version__}"


def test_completion_offers_commands_and_options(env):
    def complete(words: str) -> list[str]:
        r = subprocess.run(DSEC, env={**env, "_DSEC_COMPLETE": "complete_bash",
                                      "COMP_WORDS": words,
                                      "COMP_CWORD": str(len(words.split()) - 1)},
                           capture_output=True, text=True, timeout=60)
        return r.stdout.split()
    assert "create" in complete("dsec cr")
    assert "--json" in complete("dsec ls --j")
    # the bash script `--install-completion` installs (`--show-completion` prints it for
    # the shell it finds above it, which under CI's make is sh: not one it supports)
    script = subprocess.run(DSEC, env={**env, "_DSEC_COMPLETE": "source_bash"},
                            capture_output=True, text=True, timeout=60)
    assert "_DSEC_COMPLETE=complete_bash" in script.stdout and "complete " in script.stdout


def test_json_of_listings_and_results(cli, sb, job):
    listed = json.loads(cli("ls", "--json", "--job", job).stdout)
    assert [s["id"] for s in listed] == [sb.id] and listed[0]["state"] == "running"

    r = cli("exec", "--json", sb.id, "--", "sh", "-c", "echo out; echo err >&2; exit 3")
    assert r.returncode == 3
    result = json.loads(r.stdout)
    assert (result["exit_code"], result["stdout"], result["stderr"]) == (3, "out\n", "err\n")

    images = json.loads(cli("images", "--json").stdout)
    assert "busybox:latest" in [i["name"] for i in images]
    nodes = json.loads(cli("nodes", "--json").stdout)
    assert nodes and nodes[0]["id"].startswith("node-")
    audit = json.loads(cli("trajectory", "audit", sb.id, "--json").stdout)
    assert audit == []


def test_create_and_rm_json(cli, job):
    made = json.loads(cli("create", "--json", "--job", job, "--memory-mb", "64",
                          "-n", "2").stdout)
    assert len(made) == 2 and all(m["job"] == job for m in made)
    ids = [m["id"] for m in made]
    r = cli("rm", "--json", *ids, "sb-0000-nope")
    assert r.returncode == 1
    gone = json.loads(r.stdout)
    assert [g["stopped"] for g in gone] == [True, True, False]
    assert gone[2]["error"]["code"] == "not_found"


def test_cp_stdin_and_stdout(cli, sb, tmp_path):
    data = os.urandom(200_000).hex()  # text: run_cli's pipes are text mode
    r = cli("cp", "-", f"{sb.id}:/tmp/from-stdin", input=data)
    assert r.returncode == 0, r.stderr
    assert sb.files.read("/tmp/from-stdin") == data.encode()

    r = cli("cp", f"{sb.id}:/tmp/from-stdin", "-")
    assert r.returncode == 0, r.stderr
    assert r.stdout == data

    r = cli("cp", "--json", "-", f"{sb.id}:/tmp/again", input="abc")
    assert json.loads(r.stdout) == {"src": "-", "dst": f"{sb.id}:/tmp/again", "type": "file",
                                    "bytes": 3}
    r = cli("cp", f"{sb.id}:/tmp", "-")
    assert r.returncode == 1 and "is a directory" in r.stderr
