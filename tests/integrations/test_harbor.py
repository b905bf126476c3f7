"""A real Harbor task (tests/integrations/harbor_task, word count) end to end in a dsec
sandbox with Harbor's oracle agent: ``harbor run -e dsec.integrations.harbor:DsecEnvironment``.

Harbor needs Python >= 3.12, so it runs from its own venv (``make harbor-venv``, a
prerequisite of ``make test``; ``DSEC_HARBOR=/path/to/bin/harbor`` to use another).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TASK = Path(__file__).resolve().parent / "harbor_task"
HARBOR = Path(os.environ.get("DSEC_HARBOR", ROOT / ".venv-harbor" / "bin" / "harbor"))

pytestmark = pytest.mark.timeout(900)


def harbor_run(server, jobs: Path, *extra: str) -> subprocess.CompletedProcess:
    assert HARBOR.exists(), f"no Harbor at {HARBOR}: run `make harbor-venv` (needs python3.12)"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([str(HARBOR), "run", "-p", str(TASK), "-a", "oracle",
                           "-e", "dsec.integrations.harbor:DsecEnvironment",
                           "--ek", f"url={server.url}", "--ek", f"token={server.token}",
                           "-o", str(jobs), "-y", *extra],
                          env=env, capture_output=True, text=True, timeout=800)


def rewards(jobs: Path) -> list[str]:
    return [p.read_text().strip() for p in jobs.rglob("reward.txt")]


def test_oracle_solves_the_task_in_a_dsec_sandbox(fn_server, tmp_path):
    r = harbor_run(fn_server, tmp_path / "jobs")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert rewards(tmp_path / "jobs") == ["1"], (r.stdout[-3000:], r.stderr[-2000:])
