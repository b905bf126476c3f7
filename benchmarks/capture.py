"""Run a benchmark script that prints its own tables and file its output in results/.

    .venv/bin/python benchmarks/capture.py NAME "Title" -- benchmarks/bench_x.py [args]

The output is kept verbatim, headed by the machine and the load average like every other
result file, so RESULTS.md can be assembled the same way for every script.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import publish  # noqa: E402


def main() -> None:
    if len(sys.argv) < 5 or sys.argv[3] != "--":
        sys.exit(__doc__)
    name, title, cmd = sys.argv[1], sys.argv[2], sys.argv[4:]
    proc = subprocess.run([sys.executable, *cmd], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        sys.exit(f"{cmd[0]} failed with exit code {proc.returncode}")
    out = proc.stdout.strip()
    body = out if "|" in out else f"```\n{out}\n```"
    publish(name, title, body, notes=[f"command: `.venv/bin/python {' '.join(cmd)}`"])


if __name__ == "__main__":
    main()
