"""Builds the static dsec-agent binary from its C source, once per source version."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from dsec.api.errors import Internal

__all__ = ["ensure_agent", "SOURCE"]

SOURCE = Path(__file__).with_name("agent.c")
HEADERS = [Path(__file__).with_name("protect.h")]


# The agents this process already built or found, by source digest: another state dir
# (a test's, a second node's) gets a copy instead of a compile (slow under emulation).
_BUILT: dict[str, Path] = {}


def ensure_agent(out_dir: Path) -> Path:
    """Path of a built agent matching the current source; compiles it if needed."""
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in [SOURCE, *HEADERS])).hexdigest()[:16]
    out = out_dir / f"dsec-agent-{digest}"
    if out.exists():
        _BUILT[digest] = out
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    built = _BUILT.get(digest)
    if built is not None and built.exists():
        shutil.copy2(built, tmp)
    else:
        _compile(tmp)
    os.replace(tmp, out)
    _BUILT[digest] = out
    return out


def _compile(dest: Path) -> None:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise Internal("building dsec-agent needs gcc (apt-get install gcc libc6-dev)")
    proc = subprocess.run([cc, "-static", "-O2", "-o", str(dest), str(SOURCE)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise Internal(f"compiling dsec-agent failed: {proc.stderr[-2000:]}")
