"""A real Harbor task on dsec, run by Harbor's own CLI (``harbor run``) with Harbor's oracle
agent and the dsec environment provider, against the integration tests' dsec server.

Harbor needs Python >= 3.12 and dsec's venv is 3.11, so Harbor runs in its own venv
(``.venv-harbor``, made by ``make harbor-venv``, which ``make test`` runs) in a subprocess.
The task's image is built into dsec from its ``environment/Dockerfile`` with
``dsec image build``; the same task with a wrong solution must score 0, so the reward
really comes from the verifier that ran in the sandbox.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import dsec

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[2]
HARBOR = ROOT / ".venv-harbor" / "bin" / "harbor"
TASK = Path(__file__).parent / "harbor" / "word-count"
IMAGE = "harbor-test/word-count:1"  # the task's docker_image


@pytest.fixture(scope="module")
def harbor() -> Path:
    if not HARBOR.exists():
        msg = f"{HARBOR} is missing: run `make harbor-venv` (needs a python3.12)"
        if os.environ.get("CI"):
            pytest.fail(msg)  # CI must run this test, never skip it
        pytest.skip(msg)
    return HARBOR


@pytest.fixture(scope="module")
def task_image(fn_server) -> str:
    """The task's image, built from its Dockerfile by buildah into the server's store."""
    dockerfile = TASK / "environment" / "Dockerfile"
    built = subprocess.run([sys.executable, "-m", "dsec.cli", "image", "build", str(dockerfile),
                            "--tag", IMAGE, "--state-dir", str(fn_server.state_dir)],
                           capture_output=True, text=True, timeout=400)
    assert built.returncode == 0, f"dsec image build failed:\n{built.stdout}\n{built.stderr}"
    return IMAGE


def _variant(dataset: Path, suffix: str) -> Path:
    """A copy of the task named ``dsec/word-count-SUFFIX``."""
    task = dataset / f"word-count-{suffix}"
    shutil.copytree(TASK, task)
    toml = task / "task.toml"
    toml.write_text(toml.read_text().replace('"dsec/word-count"', f'"dsec/word-count-{suffix}"'))
    return task


def _dataset(tmp: Path) -> Path:
    """The word-count task as written; a copy whose solution is wrong; a copy whose image
    dsec cannot know (a Dockerfile and no docker_image)."""
    dataset = tmp / "dataset"
    shutil.copytree(TASK, dataset / "word-count")
    solve = _variant(dataset, "broken") / "solution" / "solve.sh"
    solve.write_text("#!/bin/bash\necho 8 > /app/count.txt\n")  # one word short
    toml = _variant(dataset, "unbuilt") / "task.toml"
    toml.write_text(toml.read_text().replace(f'docker_image = "{IMAGE}"\n', ""))
    return dataset


def _trials(jobs_dir: Path) -> dict[str, dict]:
    """Task name -> the trial's result.json, as Harbor wrote it."""
    out = {}
    for result in jobs_dir.glob("*/*/result.json"):
        trial = json.loads(result.read_text())
        out[trial["task_name"]] = trial
    return out


def _reward(trial: dict) -> float | None:
    return ((trial.get("verifier_result") or {}).get("rewards") or {}).get("reward")


def test_oracle_scores_one_and_a_wrong_solution_zero(harbor, fn_server, task_image, tmp_path):
    dataset = _dataset(tmp_path)
    jobs = tmp_path / "jobs"
    # LiteLLM's price list and Harbor's telemetry would reach for the internet
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HARBOR_TELEMETRY": "off"}
    run = subprocess.run(
        [str(harbor), "run", "-p", str(dataset), "-a", "oracle", "-n", "2", "-o", str(jobs),
         "-e", "dsec.integrations.harbor:DsecEnvironment", "-y",
         "--ek", f"url={fn_server.url}", "--ek", f"token={fn_server.token}"],
        env=env, capture_output=True, text=True, timeout=500)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    trials = _trials(jobs)
    rewards = {name: _reward(t) for name, t in trials.items()}
    assert rewards == {"dsec/word-count": 1.0, "dsec/word-count-broken": 0.0,
                       "dsec/word-count-unbuilt": None}, (rewards, run.stdout[-3000:])
    failed = trials["dsec/word-count-unbuilt"]["exception_info"]
    assert "dsec image build" in failed["exception_message"], failed
    with dsec.Client(fn_server.url, fn_server.token) as client:  # Harbor stopped its sandboxes
        assert [s.id for s in client.list() if "harbor.session" in s.labels] == []

