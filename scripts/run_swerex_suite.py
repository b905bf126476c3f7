#!/usr/bin/env python3
"""Run SWE-ReX's own runtime tests against dsec (a real server, a python:3.11 sandbox).

    python scripts/run_swerex_suite.py --tests PATH/TO/SWE-ReX/tests [pytest args...]

SWE-ReX's ``tests/test_execution.py`` drives an ``AbstractRuntime`` through fixtures
(``remote_runtime``, ``runtime_with_default_session``). Its test directory is copied to a
temporary package, and one line appended to its conftest imports dsec's fixtures
(tests/integrations/swerex_suite.py) over theirs; the tests themselves are unchanged.
``test_server_dead`` is deselected: it resolves a made-up public host name. Run as root,
under the test lock; prints pytest's summary.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tests", type=pathlib.Path, required=True,
                   help="SWE-ReX's tests/ directory (from a checkout of SWE-agent/SWE-ReX)")
    a, rest = p.parse_known_args()
    with tempfile.TemporaryDirectory(prefix="swerex-suite-") as tmp:
        pkg = pathlib.Path(tmp) / "swerex_tests"
        shutil.copytree(a.tests, pkg)
        (pkg / "__init__.py").touch()
        with open(pkg / "conftest.py", "a") as f:
            f.write("\nfrom tests.integrations.swerex_suite import *  # noqa: F401,F403\n")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "-o", "asyncio_mode=auto", "-o", "asyncio_default_fixture_loop_scope=function",
               "--rootdir", tmp, str(pkg / "test_execution.py"),
               "--deselect", f"{pkg / 'test_execution.py'}::test_server_dead", *rest]
        return subprocess.call(cmd, cwd=tmp, env=env)


if __name__ == "__main__":
    sys.exit(main())
