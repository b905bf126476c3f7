"""Egress by named permissions: a veth and nftables in the sandbox's network namespace."""

import pytest

import dsec
from tests.redteam.conftest import net_client, net_server, peer  # noqa: F401 (fixtures)
from tests.redteam.netpeer import HTTP_GET, PEER, sandbox_links, wait_links_gone


@pytest.fixture
async def net_sandbox(net_client):
    sb = await net_client.create(network={"peer": True}, memory_mb=128)
    yield sb
    await sb.stop()


async def test_a_granted_destination_is_reachable(peer, net_sandbox):
    r = await net_sandbox.exec(HTTP_GET)
    assert r.stdout.startswith("HTTP/1.0 200"), r


async def test_a_sandbox_without_network_has_only_loopback(peer, net_client):
    sb = await net_client.create(memory_mb=128)
    try:
        r = await sb.exec(f"ls /sys/class/net; {HTTP_GET}; echo rc=$?")
        assert r.stdout.split() == ["lo", "rc=0"]
        assert (await sb.network()).address is None
    finally:
        await sb.stop()


async def test_permissions_change_while_the_sandbox_runs(peer, net_sandbox):
    status = await net_sandbox.set_network({})
    assert status.allow == {}
    assert (await net_sandbox.exec(HTTP_GET)).stdout == ""
    await net_sandbox.set_network({"peer": True})
    assert (await net_sandbox.exec(HTTP_GET)).stdout.startswith("HTTP/1.0 200")


async def test_network_can_be_granted_to_a_sandbox_created_without(peer, net_client):
    sb = await net_client.create(memory_mb=128)
    try:
        await sb.set_network({"peer": True})
        assert (await sb.exec(HTTP_GET)).stdout.startswith("HTTP/1.0 200")
    finally:
        await sb.stop()


async def test_unknown_permission_is_refused(net_client):
    with pytest.raises(dsec.InvalidArgument, match="offers \\['docs', 'peer', 'pkgs'\\]"):
        await net_client.create(network={"internet": True}, memory_mb=128)


async def test_the_sandbox_cannot_change_its_own_rules(net_sandbox):
    r = await net_sandbox.exec("ip link set eth0 down; ip addr add 10.9.9.9/32 dev eth0")
    assert r.exit_code != 0
    assert "eth0" in (await net_sandbox.exec("ls /sys/class/net")).stdout


async def test_stopping_removes_the_host_end_of_the_veth(net_client):
    sb = await net_client.create(network={"docs": True}, memory_mb=128)
    mine = set(sandbox_links())
    await sb.stop()
    assert not wait_links_gone(mine)


async def test_a_stopped_sandbox_address_is_not_handed_out_at_once(net_client):
    seen = []
    for _ in range(3):
        sb = await net_client.create(network={"docs": True}, memory_mb=128)
        seen.append((await sb.network()).address)
        await sb.stop()
    assert len(set(seen)) == 3


async def test_permissions_change_on_a_paused_sandbox_without_resuming_it(peer, net_client):
    sb = await net_client.create(memory_mb=128)
    try:
        await sb.pause()
        status = await sb.set_network({"peer": True})
        assert status.address is not None
        assert (await sb.refresh()).state == "paused"
        assert (await sb.exec(HTTP_GET)).stdout.startswith("HTTP/1.0 200")
    finally:
        await sb.stop()
