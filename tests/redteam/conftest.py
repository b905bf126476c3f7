import httpx
import pytest

import dsec
from tests.redteam.netpeer import (DnsPeer, Peer, acquire, release, sandbox_links, sh,
                                   start_net_server,
                                   wait_links_gone)
from tests.support.server import ServerProcess, leftovers


def _destroy_server(srv) -> None:
    [node] = httpx.get(f"{srv.url}/v1/nodes", timeout=30,
                       headers={"authorization": f"Bearer {srv.token}"}).json()
    prefix = node["id"].removeprefix("node-")[:7]
    srv.stop_all_sandboxes()
    left = leftovers(srv.state_dir)
    srv.destroy()
    assert not left, left
    assert not wait_links_gone({n for n in sandbox_links() if n.startswith(f"dsv{prefix}")}), \
        "sandbox veths left behind"
    assert f"dsec_{prefix}" not in sh("nft list tables").stdout, "host tables left behind"


@pytest.fixture(scope="session")
def net_server():
    srv = acquire("server", start_net_server)
    yield srv
    release("server", _destroy_server)


@pytest.fixture(scope="session")
def peer():
    p = acquire("peer", lambda: Peer().start())
    yield p
    release("peer", Peer.stop)


@pytest.fixture(scope="session")
def dns_peer():
    p = acquire("dns_peer", lambda: DnsPeer().start())
    yield p
    release("dns_peer", DnsPeer.stop)


@pytest.fixture
async def net_client(net_server):
    async with dsec.AsyncClient(net_server.url, net_server.token) as c:
        yield c


@pytest.fixture(scope="module")
def guest_server():
    """A server with the microvm and vm backends, one per test module; nothing left after."""
    srv = ServerProcess(backends=["microvm", "vm"]).start()
    yield srv
    srv.stop_all_sandboxes()
    left = leftovers(srv.state_dir)
    srv.destroy()
    assert not left, left
