"""dsec demo runs its tour and leaves no sandbox behind."""

from __future__ import annotations


def test_demo_runs_and_cleans_up(cli, sync_client):
    r = cli("demo", "--count", "2", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    for expected in ("client.create_many(2", "r.exit_code = 3", "'/workspace\\nhello\\n'",
                     "r.timed_out = True", "exit code: 127", "raised dsec.NotFound",
                     "stopped 2 sandboxes", "done."):
        assert expected in out, f"{expected!r} missing from:\n{out}"
    assert not [s for s in sync_client.list() if (s.job or "").startswith("demo-")]


def test_demo_shows_a_guest_when_the_node_offers_microvm():
    import os

    from tests.cli.conftest import run_cli
    from tests.support.server import ServerProcess, leftovers
    srv = ServerProcess(backends=["container", "microvm"]).start()
    try:
        env = {**srv.env(), "COLUMNS": "200", "TERM": os.environ.get("TERM", "xterm")}
        r = run_cli(env, "demo", "--count", "1", timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "backend='microvm'" in r.stdout and "its kernel:" in r.stdout
        kernel = r.stdout.split("its kernel:")[1].split()[0].strip("'")
        assert kernel and kernel != os.uname().release  # the guest's own kernel
        assert "stopped 2 sandboxes" in r.stdout
        srv.stop_all_sandboxes()
        assert leftovers(srv.state_dir) == []
    finally:
        srv.destroy()
