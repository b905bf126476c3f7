"""Shared fixtures: one real server per test session, clients, and sandboxes that clean up."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import dsec
from dsec.node.density.config import DensityConfig
from tests.support.server import ServerProcess, leftovers

if os.geteuid() != 0:
    pytest.exit("dsec's tests run real containers and mounts: run them as root", 2)


def _sysctl(key: str) -> Path:
    return Path("/proc/sys") / key.replace(".", "/")


@pytest.fixture(scope="session", autouse=True)
def host_sysctls_as_found():
    """The host's sysctls a node raises (kernel.pid_max) as they were before the tests. A
    node puts back what it raised only when it closes with no sandbox left, never after a
    crash; the tests that kill a server on purpose left the host's pid_max raised."""
    keys = DensityConfig().sysctls
    before = {k: _sysctl(k).read_text() for k in keys if _sysctl(k).exists()}
    yield
    for key, text in before.items():
        if _sysctl(key).read_text() != text:
            _sysctl(key).write_text(text)


@pytest.fixture(scope="session")
def server():
    srv = ServerProcess().start()
    yield srv
    srv.stop_all_sandboxes()
    left = leftovers(srv.state_dir)
    srv.destroy()
    assert not left, f"sandboxes left things behind: {left}"


@pytest.fixture
async def client(server):
    async with dsec.AsyncClient(server.url, server.token) as c:
        yield c


@pytest.fixture
def sync_client(server):
    with dsec.Client(server.url, server.token) as c:
        yield c


@pytest.fixture
async def sandbox(client):
    sb = await client.create(memory_mb=256)
    yield sb
    try:
        await sb.stop()
    except dsec.NotFound:
        pass
