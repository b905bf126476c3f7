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
