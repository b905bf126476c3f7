"""``dsec trajectory show`` and ``audit`` against a real server."""

import json

from typer.testing import CliRunner

from dsec.cli.trajectory import trajectory_app


def _invoke(server, *args: str):
    env = {"DSEC_URL": server.url, "DSEC_TOKEN": server.token}
    return CliRunner().invoke(trajectory_app, list(args), env=env)


async def test_show_prints_each_step(server, sandbox):
    await sandbox.exec("echo one", step="s1")
    await sandbox.exec("exit 3", step="s2")
    res = _invoke(server, "show", sandbox.id)
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert any("s1" in ln and "echo one" in ln for ln in lines)
    assert any("s2" in ln and " 3 " in ln for ln in lines)
    assert "2 of 2 entries" in res.output


async def test_show_json_carries_results(server, sandbox):
    await sandbox.exec("echo one", step="s1")
    res = _invoke(server, "show", sandbox.id, "--json")
    [entry] = [json.loads(ln) for ln in res.output.splitlines()]
    assert entry["result"]["stdout"] == "one\n"


def test_unknown_sandbox_is_one_red_line(server):
    res = _invoke(server, "audit", "sb-nope-000000000000")
    assert res.exit_code == 1 and "error:" in res.output
