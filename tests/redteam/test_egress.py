"""Port scans from a sandbox are refused and counted; granted traffic still flows."""

from tests.redteam.netpeer import HTTP_GET, PEER, PEER_PORT, gateway_of

SCAN = "for p in $(seq 1 40); do nc -w 1 {host} $p </dev/null 2>/dev/null; done; echo done"


async def test_a_port_scan_is_dropped_and_counted(peer, net_client):
    sb = await net_client.create(network={"peer": True}, memory_mb=128)
    try:
        gateway = await gateway_of(sb)
        r = await sb.exec(SCAN.format(host=PEER) + "; " + SCAN.format(host=gateway),
                          timeout=300)
        assert r.stdout == "done\ndone\n"
        status = await sb.network()
        scanned = {(f.address, f.port) for f in status.denied}
        assert {(PEER, p) for p in range(1, 41)} <= scanned
        assert {(gateway, p) for p in range(1, 41)} <= scanned
        assert status.dropped >= 80
        assert (PEER, PEER_PORT) not in scanned
        assert (await sb.exec(HTTP_GET)).stdout.startswith("HTTP/1.0 200")
    finally:
        await sb.stop()


async def test_udp_and_other_addresses_are_refused_too(peer, net_client):
    sb = await net_client.create(network={"peer": True}, memory_mb=128)
    try:
        await sb.exec("nslookup -timeout=1 example.test 192.0.2.1; "
                      "nc -w 1 198.51.100.1 443 </dev/null")
        denied = {(f.address, f.protocol, f.port) for f in (await sb.network()).denied}
        assert {("192.0.2.1", "udp", 53), ("198.51.100.1", "tcp", 443)} <= denied
    finally:
        await sb.stop()
