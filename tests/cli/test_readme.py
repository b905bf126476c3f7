"""The README's Python examples run as they are printed, as scripts, against a real server
with the backends ``make run`` starts them on (container and fncall, busybox and
``python:3.11``)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.images import ensure_debian_image
from tests.support.server import ServerProcess, leftovers

README = Path(__file__).resolve().parents[2] / "README.md"


def python_blocks(text: str, section: str = "## Python") -> list[str]:
    """The ```python blocks of one ``##`` section of ``text``, in order."""
    start = text.index(f"\n{section}\n")
    end = text.find("\n## ", start + 1)
    body = text[start:end if end != -1 else len(text)]
    return re.findall(r"^```python\n(.*?)^```$", body, re.S | re.M)


@pytest.fixture(scope="module")
def readme_server():
    srv = ServerProcess(backends=["container", "fncall"])
    ensure_debian_image(srv.state_dir)  # fncall's workers run python:3.11
    srv.start()
    yield srv
    srv.stop_all_sandboxes()
    srv.stop()  # closes the fncall pools
    left = leftovers(srv.state_dir)
    srv.destroy()
    assert not left, f"the README examples left things behind: {left}"


def test_the_python_section_has_the_two_examples():
    assert len(python_blocks(README.read_text())) >= 2


@pytest.mark.parametrize("index", [0, 1], ids=["async", "blocking"])
def test_readme_python_example_runs_as_a_script(readme_server, tmp_path, index):
    code = python_blocks(README.read_text())[index]
    script = tmp_path / "example.py"
    script.write_text(code)
    env = {**readme_server.env()}
    env.pop("DSEC_STATE_DIR")  # as a user's shell: URL and token only
    r = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"README example {index + 1} failed:\n{code}\n{r.stdout}{r.stderr}"
