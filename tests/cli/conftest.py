"""Fixtures for the CLI tests: the real ``dsec`` command in a subprocess, pointed at the
session's server, and sandboxes and jobs that are stopped afterwards."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

import pytest

import dsec

DSEC = [sys.executable, "-m", "dsec.cli"]


def run_cli(env: dict[str, str], *args: str, input: str | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``dsec ARGS...`` to completion; output decoded, never raising on exit status."""
    return subprocess.run([*DSEC, *args], env=env, input=input, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def env(server) -> dict[str, str]:
    """The environment a user would have: DSEC_URL and DSEC_TOKEN of the test server."""
    return {**server.env(), "COLUMNS": "200", "TERM": os.environ.get("TERM", "xterm")}


@pytest.fixture
def cli(env):
    """``cli("ls", "-q")`` runs the real command against the test server."""
    return lambda *args, **kw: run_cli(env, *args, **kw)


@pytest.fixture
def job(sync_client):
    """A fresh job name; every sandbox of that job is stopped after the test."""
    name = f"clitest-{secrets.token_hex(4)}"
    yield name
    sync_client.stop_all(job=name)


@pytest.fixture
def sb(sync_client, job):
    """One running sandbox (of ``job``), stopped after the test."""
    s = sync_client.create(memory_mb=128, job=job)
    yield s
    try:
        s.stop()
    except dsec.NotFound:
        pass


def one_error_line(stderr: str) -> str:
    """The single ``error: ...`` line of a failed command (no traceback, nothing else)."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert "Traceback" not in stderr
    return lines[0]
