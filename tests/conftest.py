"""Shared fixtures: one real server per test session, clients, and sandboxes that clean up."""

from __future__ import annotations

import os

import pytest

import dsec
from tests.support.server import ServerProcess, leftovers

if os.geteuid() != 0:
    pytest.exit("dsec's tests run real containers and mounts: run them as root", 2)


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
