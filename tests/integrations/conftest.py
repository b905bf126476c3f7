"""One real server with the container and fncall backends and the Debian image
(``python:3.11``: python, bash, perl, C, C++) for the integration tests, shared by the module
tests of every integration."""

from __future__ import annotations

import pytest

from tests.support.images import ensure_debian_image
from tests.support.server import ServerProcess, leftovers


@pytest.fixture(scope="session")
def fn_server():
    srv = ServerProcess(backends=["container", "fncall"])
    ensure_debian_image(srv.state_dir)
    srv.start()
    yield srv
    srv.stop_all_sandboxes()
    srv.stop()  # closes the fncall pools: every worker container is removed
    left = leftovers(srv.state_dir)
    srv.destroy()
    assert not left, f"the integration tests left things behind: {left}"


@pytest.fixture
def e2b_env(server, monkeypatch):
    """The unmodified e2b SDK pointed at ``server`` (a module's own server fixture)."""
    monkeypatch.setenv("E2B_API_URL", f"{server.url}/e2b")
    monkeypatch.setenv("E2B_SANDBOX_URL", f"{server.url}/e2b/envd")
    monkeypatch.setenv("E2B_API_KEY", server.token)
    return server
