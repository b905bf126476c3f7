"""Nothing inside a sandbox reaches the node: its port, socket, state, logs, or a neighbour."""

import secrets

import pytest

from tests.redteam.netpeer import gateway_of

SKIP_PSEUDO = "-path /proc -prune -o -path /sys -prune -o"


@pytest.fixture
async def two(client):
    a = await client.create(memory_mb=128)
    b = await client.create(memory_mb=128)
    yield a, b
    await a.stop()
    await b.stop()


async def test_node_port_is_unreachable_from_a_sandbox(server, sandbox):
    r = await sandbox.exec(f"nc -w 2 127.0.0.1 {server.port} </dev/null; echo rc=$?")
    assert "rc=1" in r.stdout, r


async def test_node_port_is_unreachable_through_the_veth(net_server, net_client):
    sb = await net_client.create(network={"peer": True}, memory_mb=128)
    try:
        host = await gateway_of(sb)
        r = await sb.exec(f"nc -w 2 {host} {net_server.port} </dev/null; echo rc=$?")
        assert "rc=1" in r.stdout, r
        assert any(f.port == net_server.port for f in (await sb.network()).denied)
    finally:
        await sb.stop()


async def test_node_state_token_and_sockets_are_not_in_the_sandbox(server, sandbox):
    r = await sandbox.exec(
        f"ls {server.state_dir}; find / {SKIP_PSEUDO} \\( -name agent.sock -o -name node.db "
        f"-o -name trajectory.db -o -name token -o -name server.log \\) -print")
    assert r.stdout == "" and "No such file" in r.stderr, r
    r = await sandbox.exec(f"grep -rl {server.token} /bin /etc /root /tmp /usr /var /.dsec")
    assert r.stdout == "" and r.exit_code == 1, r


async def test_a_neighbours_files_and_processes_are_invisible(two):
    a, b = two
    secret = f"secret-{secrets.token_hex(6)}"
    await a.exec(f"echo {secret} > /tmp/{secret}; sleep 1234 >/dev/null 2>&1 &")
    found = await b.exec(f"find / {SKIP_PSEUDO} -name '{secret}*' -print")
    grepped = await b.exec(f"grep -rl {secret} /tmp /root /var")
    assert found.stdout == grepped.stdout == "", (found, grepped)
    assert "sleep 1234" not in (await b.exec("ps -o args")).stdout
    assert "sleep 1234" in (await a.exec("ps")).stdout
