"""Harbor oracle trials on dsec: trial wall time through ``harbor run``, beside the same
steps driven through dsec's SDK directly, on the same server.

The word-count task of the Harbor test (``tests/integrations/harbor/word-count``), its image
built into dsec from its Dockerfile. A Harbor trial (as Harbor's result.json times it):
sandbox start, the oracle agent uploading and running ``solution/solve.sh``, the verifier
uploading and running ``tests/test.sh``, the reward downloaded, the sandbox stopped. The
baseline does those steps with the dsec SDK in one Python process, no Harbor. The natural
baseline, the same trial on Harbor's own docker environment, cannot run here: this machine
has no Docker daemon. Needs ``make harbor-venv``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import common

import dsec
from tests.support.images import ensure_debian_image

ROOT = Path(__file__).resolve().parents[1]
HARBOR = ROOT / ".venv-harbor" / "bin" / "harbor"
TASK = ROOT / "tests" / "integrations" / "harbor" / "word-count"
IMAGE = "harbor-test/word-count:1"


def _secs(timing: dict | None) -> float:
    """Seconds of one of Harbor's TimingInfo entries."""
    if not timing:
        return 0.0
    start, end = (datetime.fromisoformat(timing[k]) for k in ("started_at", "finished_at"))
    return (end - start).total_seconds()


def harbor_trials(srv, n: int, jobs: Path) -> tuple[list[dict[str, float]], float]:
    """``n`` sequential oracle trials in one ``harbor run``: each trial's phases, and the
    ``harbor run`` process's wall time, seconds."""
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HARBOR_TELEMETRY": "off"}
    t0 = time.perf_counter()
    subprocess.run([str(HARBOR), "run", "-p", str(TASK), "-a", "oracle", "-k", str(n),
                    "-n", "1", "-o", str(jobs), "-y", "-q",
                    "-e", "dsec.integrations.harbor:DsecEnvironment",
                    "--ek", f"url={srv.url}", "--ek", f"token={srv.token}"],
                   env=env, check=True, capture_output=True, timeout=900)
    wall = time.perf_counter() - t0
    out = []
    for result in sorted(jobs.glob("*/*/result.json")):
        t = json.loads(result.read_text())
        if t.get("exception_info") or t["verifier_result"]["rewards"]["reward"] != 1.0:
            raise SystemExit(f"a Harbor trial did not score 1: {result}")
        out.append({"trial": _secs(t), "setup": _secs(t.get("environment_setup")),
                    "agent": _secs(t.get("agent_execution")), "verifier": _secs(t.get("verifier"))})
    return out, wall


def sdk_trial(client: dsec.Client) -> float:
    """The trial's steps through dsec's SDK; seconds."""
    t0 = time.perf_counter()
    sb = client.create(image=IMAGE, memory_mb=2048, disk_mb=4096, network="none")
    for d in ("/logs/agent", "/logs/verifier", "/logs/artifacts", "/solution", "/tests"):
        sb.files.mkdir(d, parents=True)
    sb.files.upload_dir(TASK / "solution", "/solution")
    assert sb.exec(["bash", "-c", "bash /solution/solve.sh"], cwd="/app").exit_code == 0
    sb.files.upload_dir(TASK / "tests", "/tests")
    assert sb.exec(["bash", "-c", "bash /tests/test.sh"], cwd="/app").exit_code == 0
    reward = sb.files.read("/logs/verifier/reward.txt")
    sb.stop()
    assert reward.strip() == b"1", reward
    return time.perf_counter() - t0


def main(quick: bool) -> None:
    rounds, n = (1, 2) if quick else (2, 5)
    if not HARBOR.exists():
        raise SystemExit(f"{HARBOR} is missing: run `make harbor-venv`")
    harbor: list[dict[str, float]] = []
    sdk: list[float] = []
    walls: list[float] = []
    with common.server() as srv, tempfile.TemporaryDirectory() as tmp:
        ensure_debian_image(srv.state_dir)
        subprocess.run([sys.executable, "-m", "dsec.cli", "image", "build",
                        str(TASK / "environment" / "Dockerfile"), "--tag", IMAGE,
                        "--state-dir", str(srv.state_dir)], check=True, capture_output=True)
        with dsec.Client(srv.url, srv.token) as client:
            sdk_trial(client)  # warm-up: the image's layers mounted once
            for r in range(rounds):  # interleaved, so load from others falls on both
                trials, wall = harbor_trials(srv, n, Path(tmp) / f"jobs{r}")
                harbor += trials
                walls.append(wall)
                sdk += [sdk_trial(client) for _ in range(n)]
    left = srv.left
    base = common.percentile(sdk, 50)
    med = {k: common.percentile([t[k] for t in harbor], 50)
           for k in ("trial", "setup", "agent", "verifier")}
    rows = [["Harbor `harbor run -a oracle -e dsec…DsecEnvironment`, one trial", len(harbor),
             f"{med['trial']:.2f}", f"{common.percentile([t['trial'] for t in harbor], 90):.2f}",
             common.ratio(med["trial"], base)],
            ["dsec SDK, the same steps (baseline)", len(sdk), f"{base:.2f}",
             f"{common.percentile(sdk, 90):.2f}", "1.00×"]]
    body = common.table(["path", "n", "p50 s", "p90 s", "p50 / SDK"], rows)
    notes = [f"Harbor trial phases, medians: environment start {med['setup']:.2f} s, oracle "
             f"agent {med['agent']:.2f} s, verifier {med['verifier']:.2f} s (Harbor's "
             "result.json; the trial time also holds stop and Harbor's own bookkeeping).",
             f"`harbor run` process for {n} trials, start to exit (Python start, imports, "
             f"job setup included): median {common.percentile(walls, 50):.1f} s.",
             "harbor 0.26.0 (Python 3.12, its own venv), the word-count task of "
             "tests/integrations/harbor, image built into dsec from its Dockerfile; "
             f"{rounds} rounds of {n} sequential Harbor trials then {n} SDK runs.",
             "No Harbor-on-docker baseline: this machine has no Docker daemon, so Harbor's "
             "default environment cannot run here.",
             "Cleanup after stop: " + ("nothing left" if not left else ", ".join(left))]
    name = "harbor-quick" if quick else "harbor"
    common.publish(name, "Harbor oracle trial on dsec" + (" (quick)" if quick else ""),
                   body, notes)
    if left:
        raise SystemExit(f"leftovers: {left}")


if __name__ == "__main__":
    main(common.parse_args(__doc__).quick)
