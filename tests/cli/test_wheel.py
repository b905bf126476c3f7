"""The wheel as users install it: ``pip install dsec-sandbox`` is the client alone.

Builds the wheel from a copy of the tree, installs it into a fresh venv (its dependencies
from the package index, no server extra), checks that none of the server's stack came
along, and drives the session's test server with that venv's ``dsec`` command and SDK.
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

ROOT = Path(__file__).resolve().parents[2]
SERVER_ONLY = ("fastapi", "uvicorn", "uvloop", "starlette", "prometheus_client", "ray",
               "structlog", "fastapi_offline", "zstandard")


def _clean(env: dict[str, str]) -> dict[str, str]:
    """No PYTHONPATH: the venv must import its own copy, not this tree's."""
    return {k: v for k, v in env.items() if k != "PYTHONPATH"}


def _run(*cmd, env=None, timeout=600, check=True) -> subprocess.CompletedProcess:
    res = subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                         env=_clean(env if env is not None else dict(os.environ)),
                         timeout=timeout)
    if check and res.returncode != 0:
        raise AssertionError(f"{cmd} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return res


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory) -> Path:
    """A fresh venv holding only the client wheel and its dependencies."""
    tmp = tmp_path_factory.mktemp("wheel")
    tree = tmp / "tree"  # a copy: an in-tree build would leave build/ and egg-info behind
    shutil.copytree(ROOT / "src", tree / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
         "-w", tmp / "dist", tree)
    wheels = list((tmp / "dist").glob("dsec_sandbox-*.whl"))
    assert len(wheels) == 1, wheels
    venv = tmp / "venv"
    _run(sys.executable, "-m", "venv", venv)
    _run(venv / "bin" / "python", "-m", "pip", "install", "-q", wheels[0])
    return venv


def _env(server) -> dict[str, str]:
    return {**server.env(), "COLUMNS": "200"}


def test_plain_install_is_the_client_only(client_venv):
    py = client_venv / "bin" / "python"
    found = _run(py, "-c", "import importlib.util as u, json, sys; print(json.dumps("
                           "[m for m in sys.argv[1:] if u.find_spec(m)]))", *SERVER_ONLY)
    assert json.loads(found.stdout) == []
    dist = _run(py, "-m", "pip", "show", "-f", "dsec-sandbox").stdout
    assert "dsec/py.typed" in dist and "dsec/sdk/sync.pyi" in dist
    here = _run(py, "-c", "import dsec; print(dsec.__file__)").stdout
    assert str(client_venv) in here  # the wheel's copy, not this tree's


def test_installed_cli_and_sdk_talk_to_a_server(client_venv, server):
    env = _env(server)
    cli = client_venv / "bin" / "dsec"
    assert _run(cli, "--version", env=env).stdout.strip() == f"dsec {dsec.__version__}"
    script = ("import dsec\n"
              "with dsec.Client() as c:\n"
              "    sb = c.create(memory_mb=64, labels={'wheel': 'yes'})\n"
              "    print(sb.id)\n"
              "    print(sb.exec('echo hi from the wheel').stdout, end='')\n")
    out = _run(client_venv / "bin" / "python", "-c", script, env=env).stdout.split("\n")
    sb_id = out[0]
    try:
        assert out[1] == "hi from the wheel"
        listed = json.loads(_run(cli, "ls", "--json", "--label", "wheel=yes", env=env).stdout)
        assert [s["id"] for s in listed] == [sb_id]
    finally:
        _run(cli, "rm", sb_id, env=env)


def test_server_commands_name_the_extra(client_venv, server):
    res = _run(client_venv / "bin" / "dsec", "serve", "--port", "1", env=_env(server),
               check=False)
    assert res.returncode == 1
    assert "pip install 'dsec-sandbox[server]'" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
