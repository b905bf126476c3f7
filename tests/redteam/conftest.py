import pytest

import dsec
from tests.redteam.netpeer import Peer, sandbox_links, sh, start_net_server, wait_links_gone
from tests.support.server import leftovers


@pytest.fixture(scope="session")
def net_server():
    srv = start_net_server()
    yield srv
    srv.stop_all_sandboxes()
    left = leftovers(srv.state_dir)
    srv.destroy()
    assert not left, left
    assert not wait_links_gone(set(sandbox_links())), "sandbox veths left behind"
    assert "dsec_host" not in sh("nft list tables").stdout, "host tables left behind"


@pytest.fixture(scope="session")
def peer():
    p = Peer().start()
    yield p
    p.stop()


@pytest.fixture
async def net_client(net_server):
    async with dsec.AsyncClient(net_server.url, net_server.token) as c:
        yield c
