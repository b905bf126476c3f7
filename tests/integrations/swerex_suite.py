"""Fixtures that point SWE-ReX's own runtime tests (their ``tests/test_execution.py``) at a
dsec sandbox instead of their local server. Not collected here: ``scripts/run_swerex_suite.py``
copies SWE-ReX's test directory aside and imports these names into its conftest, where they
replace ``remote_runtime`` and ``runtime_with_default_session``."""

from __future__ import annotations

import pytest
from swerex.runtime.abstract import CloseBashSessionRequest, CreateBashSessionRequest

from dsec.integrations.swerex import DsecDeployment
from tests.support.images import ensure_debian_image
from tests.support.server import ServerProcess, leftovers

__all__ = ["dsec_server", "remote_runtime", "runtime_with_default_session"]


@pytest.fixture(scope="session")
def dsec_server():
    srv = ServerProcess(backends=["container"])
    ensure_debian_image(srv.state_dir)
    srv.start()
    yield srv
    srv.stop_all_sandboxes()
    srv.stop()
    left = leftovers(srv.state_dir)
    srv.destroy()
    assert not left, left


@pytest.fixture
async def remote_runtime(dsec_server):
    d = DsecDeployment(image="python:3.11", url=dsec_server.url, token=dsec_server.token)
    await d.start()
    try:
        yield d.runtime
    finally:
        await d.stop()


@pytest.fixture
async def runtime_with_default_session(remote_runtime):
    await remote_runtime.create_session(CreateBashSessionRequest())
    try:
        yield remote_runtime
    finally:
        await remote_runtime.close_session(CloseBashSessionRequest())
