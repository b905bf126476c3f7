"""Attack programs run inside sandboxes, built static on the host once per session."""

from __future__ import annotations

import hashlib
import subprocess
import tempfile
from pathlib import Path

__all__ = ["build_probe"]

HERE = Path(__file__).parent
_OUT = Path(tempfile.gettempdir()) / "dsec-probes"


def build_probe(name: str) -> Path:
    """The static binary of ``probes/<name>.c``, compiled if its source changed."""
    src = HERE / f"{name}.c"
    digest = hashlib.sha256(src.read_bytes()).hexdigest()[:12]
    out = _OUT / f"{name}-{digest}"
    if not out.exists():
        _OUT.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        subprocess.run(["gcc", "-static", "-O1", "-o", str(tmp), str(src)], check=True,
                       capture_output=True)
        tmp.rename(out)
    return out
