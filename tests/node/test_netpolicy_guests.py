"""Egress by named permissions on microvm and vm guests: the same rules as containers.

Each guest's QEMU runs in the guest's own network namespace; the node plumbs a veth and
nftables there exactly as for a container, and the guest's connections leave as QEMU's
sockets in it. Guests boot under TCG on this machine (nested KVM does not run)."""

import pytest

from tests.redteam.conftest import net_client, net_server, peer  # noqa: F401 (fixtures)
from tests.redteam.netpeer import HTTP_GET, PEER, PEER_PORT, gateway_of

pytestmark = pytest.mark.timeout(600)
GUESTS = ["microvm", "vm"]


@pytest.mark.parametrize("backend", GUESTS)
async def test_guest_egress_follows_its_permissions(peer, net_client, net_server, backend):
    sb = await net_client.create(backend=backend, memory_mb=256)
    try:
        # network="none": the guest's namespace has loopback only, nothing leaves.
        assert (await sb.exec(HTTP_GET, timeout=30)).stdout == ""
        assert (await sb.network()).address is None

        status = await sb.set_network({"peer": True})  # granted while it runs
        assert status.address is not None
        r = await sb.exec(HTTP_GET, timeout=30)
        assert r.stdout.startswith("HTTP/1.0 200"), r

        # Granted the peer's port only: another port there, and the node itself, refused.
        other = await sb.exec(f"echo x | nc -w 3 {PEER} 22; echo rc=$?", timeout=30)
        assert "rc=0" not in other.stdout
        node_port = net_server.url.rsplit(":", 1)[1]
        host = await sb.exec(f"echo x | nc -w 3 {await gateway_of(sb)} {node_port}; echo rc=$?",
                             timeout=30)
        assert "rc=0" not in host.stdout

        await sb.set_network({})  # revoked: refused and counted per destination
        assert (await sb.exec(HTTP_GET, timeout=30)).stdout == ""
        status = await sb.network()
        assert status.dropped > 0
        assert (PEER, "tcp", PEER_PORT) in {(f.address, f.protocol, f.port)
                                            for f in status.denied}
    finally:
        await sb.stop()


async def test_guest_created_with_permissions_reaches_only_what_they_grant(peer, net_client):
    sb = await net_client.create(backend="microvm", network={"peer": True}, memory_mb=256)
    try:
        assert (await sb.exec(HTTP_GET, timeout=30)).stdout.startswith("HTTP/1.0 200")
        assert (await sb.exec("echo x | nc -w 3 203.0.113.9 80; echo rc=$?",
                              timeout=30)).stdout.strip() != "rc=0"
        audit = await sb.audit()
        assert any(a.kind == "network_denied" and "203.0.113.9:80" in a.detail for a in audit)
    finally:
        await sb.stop()
