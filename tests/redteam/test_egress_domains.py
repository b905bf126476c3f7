"""Egress by domain: the node resolves for the sandbox, and only what it resolved for a
granted domain passes. Upstream DNS (dnsmasq) and HTTP servers run in a network namespace
of their own on this machine (netpeer.DnsPeer)."""

import pytest

from tests.redteam.netpeer import DNS_NET, DNS_SERVER, PEER_PORT


def get(host: str, port: int = PEER_PORT) -> str:
    """Fetch http://host:port/ from the sandbox; a name is resolved with nslookup first
    (busybox-static's resolver functions need NSS, which static glibc lacks)."""
    if not host[0].isdigit():
        host = (f"$(nslookup {host} 2>/dev/null | sed -n 's/^Address: *\\([0-9.]*\\)$/\\1/p' "
                "| tail -1)")
    return (f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 {host} {port} | head -1 | "
            "grep -q '^HTTP/1.0 200' && echo REACHED_OK")


@pytest.fixture
async def pkgs(dns_peer, net_client):
    sb = await net_client.create(network={"pkgs": True}, memory_mb=128)
    yield sb
    await sb.stop()


async def test_an_allowed_domain_is_reachable(pkgs):
    for host in ("pkgs.test", "www.pkgs.test", "files.pkgs.test"):  # name, subdomain, CNAME
        r = await pkgs.exec(get(host), timeout=30)
        assert r.stdout == "REACHED_OK\n", (host, r)


async def test_another_domain_is_refused_and_counted(pkgs):
    r = await pkgs.exec("nslookup other.test; " + get("other.test"), timeout=30)
    assert "REACHED_OK" not in r.stdout and f"Address: {DNS_NET}.5\n" not in r.stdout, r
    status = await pkgs.network()
    assert status.denied_domains.get("other.test", 0) >= 1, status
    audit = {(a.kind, a.detail) for a in await pkgs.audit()}
    assert ("dns_denied", "other.test") in audit


async def test_an_address_nobody_resolved_is_refused_and_counted(pkgs):
    # other.test's and the CDN's addresses, straight: no DNS answer put them in the set
    r = await pkgs.exec(f"{get(DNS_NET + '.5')}; {get(DNS_NET + '.4')}", timeout=30)
    assert "REACHED_OK" not in r.stdout, r
    denied = {(f.address, f.port) for f in (await pkgs.network()).denied}
    assert {(f"{DNS_NET}.5", PEER_PORT), (f"{DNS_NET}.4", PEER_PORT)} <= denied


async def test_a_resolved_address_passes_only_on_the_permissions_ports(pkgs):
    assert (await pkgs.exec(get("pkgs.test"), timeout=30)).stdout == "REACHED_OK\n"
    r = await pkgs.exec(f"nc -w 2 {DNS_NET}.3 22 </dev/null; echo rc=$?", timeout=30)
    assert "rc=0" not in r.stdout
    assert (f"{DNS_NET}.3", 22) in {(f.address, f.port) for f in (await pkgs.network()).denied}


async def test_dns_to_any_server_goes_through_the_node(pkgs):
    """Asking the upstream (or any address) directly still meets the node's resolver: a
    refused name stays refused, an allowed one still opens the way."""
    r = await pkgs.exec(f"nslookup other.test {DNS_SERVER}; nslookup pkgs.test 192.0.2.1",
                        timeout=30)
    assert f"Address: {DNS_NET}.5\n" not in r.stdout, r
    assert f"Address: {DNS_NET}.3\n" in r.stdout, r
    assert (await pkgs.network()).denied_domains.get("other.test", 0) >= 1


async def test_revoking_the_permission_closes_the_domain(pkgs):
    assert (await pkgs.exec(get("pkgs.test"), timeout=30)).stdout == "REACHED_OK\n"
    await pkgs.set_network({})
    r = await pkgs.exec(get(f"{DNS_NET}.3") + "; " + get("pkgs.test"), timeout=30)
    assert "REACHED_OK" not in r.stdout, r


async def test_a_sandbox_without_the_permission_resolves_nothing(dns_peer, net_client):
    sb = await net_client.create(network={"peer": True}, memory_mb=128)
    try:
        r = await sb.exec(f"nslookup pkgs.test {DNS_SERVER}; " + get(f"{DNS_NET}.3"),
                          timeout=30)
        assert "REACHED_OK" not in r.stdout and f"Address: {DNS_NET}.3\n" not in r.stdout, r
        denied = {(f.address, f.protocol, f.port) for f in (await sb.network()).denied}
        assert (DNS_SERVER, "udp", 53) in denied
    finally:
        await sb.stop()


async def test_a_permission_granted_later_starts_the_resolver(dns_peer, net_client):
    sb = await net_client.create(network={"peer": True}, memory_mb=128)
    try:
        await sb.set_network({"pkgs": True})
        assert (await sb.exec(get("pkgs.test"), timeout=30)).stdout == "REACHED_OK\n"
    finally:
        await sb.stop()
