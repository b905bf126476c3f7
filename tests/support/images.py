"""The Debian test image (python3, git, gcc), built once per machine and imported per store."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def ensure_debian_image(state_dir: Path) -> None:
    """Build (first time: about a minute with mmdebstrap) or import (seconds) the tags
    ``debian:12`` and ``python:3.11`` into the layer store at ``state_dir``."""
    subprocess.run([sys.executable, str(ROOT / "scripts" / "build_debian_image.py"),
                    "--state-dir", str(state_dir)], check=True, stdout=subprocess.DEVNULL)
