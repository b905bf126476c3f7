"""Denied actions of a sandbox are recorded and queryable through the API, per sandbox."""

import pytest

import dsec


async def test_audit_lists_denied_network_and_divergent_replays(peer, net_client):
    sb = await net_client.create(network={"peer": True}, memory_mb=128)
    bystander = await net_client.create(network={"peer": True}, memory_mb=128)
    try:
        await sb.exec("nc -w 1 192.0.2.9 25 </dev/null", step="a")
        await sb.exec("true", step="b")
        await sb.exec("nc -w 1 192.0.2.9 25 </dev/null", step="a")
        with pytest.raises(dsec.TrajectoryDiverged):
            await sb.exec("rm -rf /repo", step="c")
        kinds = {(r.kind, r.detail.split(" (")[0]) for r in await sb.audit()}
        assert ("network_denied", "tcp 192.0.2.9:25") in kinds
        assert any(k == "trajectory_diverged" for k, _ in kinds)
        assert await bystander.audit() == []
    finally:
        await sb.stop()
        await bystander.stop()


async def test_network_denials_stay_in_the_audit_after_the_sandbox_stopped(peer, net_client):
    sb = await net_client.create(network={"peer": True}, memory_mb=128)
    await sb.exec("nc -w 1 192.0.2.10 6379 </dev/null")
    await sb.stop()
    records = await sb.audit()
    assert [(r.kind, r.detail, r.count) for r in records] == [
        ("network_denied", "tcp 192.0.2.10:6379", 1)]
