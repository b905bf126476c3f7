"""A node with egress permissions, and a peer host in its own netns to talk to."""

from __future__ import annotations

import json
import secrets
import subprocess
import tempfile
import time
from pathlib import Path

from tests.support.server import ServerProcess

PEER = "10.214.77.2"      # the peer's address; only port PEER_PORT is granted
PEER_PORT = 8080
SUBNET = "10.215.0.0/24"  # this test node's sandboxes (apart from a default node's)
PERMISSIONS = {"peer": {"addresses": [f"{PEER}/32"], "ports": [PEER_PORT]},
               "docs": {"addresses": ["203.0.113.0/24"]},
               "pkgs": {"domains": ["pkgs.test"], "ports": [PEER_PORT]}}
# DnsPeer: a DNS server (dnsmasq) and HTTP servers in a netns of their own, as the node's
# upstream resolver and the hosts behind the names it serves.
DNS_NET = "10.216.0"
DNS_SERVER = f"{DNS_NET}.53"
NAMES = {"pkgs.test": f"{DNS_NET}.3", "www.pkgs.test": f"{DNS_NET}.3",
         "edge.cdn.test": f"{DNS_NET}.4", "other.test": f"{DNS_NET}.5"}
CNAMES = {"files.pkgs.test": "edge.cdn.test"}  # a registry's files behind a CDN's name


def sh(cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, shell=True, capture_output=True, text=True)


def start_net_server() -> ServerProcess:
    d = Path(tempfile.mkdtemp(prefix="dsec-net-"))
    (d / "network.json").write_text(json.dumps({"subnet": SUBNET, "permissions": PERMISSIONS,
                                                "dns_upstreams": [DNS_SERVER]}))
    # Guests too: their egress goes through the same per-sandbox rules as containers'.
    return ServerProcess(state_dir=d, backends=["container", "microvm", "vm"]).start()


class Peer:
    """A netns with a veth to the host and an HTTP server on PEER:PEER_PORT."""

    def __init__(self) -> None:
        self.ns = f"dsec-tpeer-{secrets.token_hex(3)}"
        self.link = f"dstp{secrets.token_hex(3)}"
        self.http: subprocess.Popen | None = None

    def start(self) -> Peer:
        out = sh(f"ip netns add {self.ns} && "
                 f"ip link add {self.link} type veth peer name eth0 netns {self.ns} && "
                 f"ip addr add 10.214.77.1/24 dev {self.link} && ip link set {self.link} up && "
                 f"ip -n {self.ns} addr add {PEER}/24 dev eth0 && "
                 f"ip -n {self.ns} link set eth0 up && ip -n {self.ns} link set lo up")
        assert out.returncode == 0, out.stderr
        self.http = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, "python3", "-m", "http.server", str(PEER_PORT),
             "--bind", PEER], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 30
        while f"{PEER}:{PEER_PORT}" not in sh(f"ip netns exec {self.ns} ss -tln").stdout:
            assert time.time() < deadline, "peer HTTP server did not start"
            time.sleep(0.1)
        return self

    def stop(self) -> None:
        if self.http:
            self.http.kill()
            self.http.wait()
        sh(f"ip netns del {self.ns}")  # takes the veth with it


class DnsPeer:
    """A netns with a veth to the host, dnsmasq answering NAMES and CNAMES on DNS_SERVER,
    and one HTTP server on PEER_PORT of every address there."""

    def __init__(self) -> None:
        self.ns = f"dsec-tdns-{secrets.token_hex(3)}"
        self.link = f"dstd{secrets.token_hex(3)}"
        self.procs: list[subprocess.Popen] = []

    def start(self) -> DnsPeer:
        addrs = sorted({DNS_SERVER, *NAMES.values()})
        out = sh(f"ip netns add {self.ns} && "
                 f"ip link add {self.link} type veth peer name eth0 netns {self.ns} && "
                 f"ip addr add {DNS_NET}.1/24 dev {self.link} && ip link set {self.link} up && "
                 + "".join(f"ip -n {self.ns} addr add {a}/24 dev eth0 && " for a in addrs) +
                 f"ip -n {self.ns} link set eth0 up && ip -n {self.ns} link set lo up")
        assert out.returncode == 0, out.stderr
        records = [f"--host-record={n},{a}" for n, a in NAMES.items()]
        records += [f"--cname={n},{t}" for n, t in CNAMES.items()]
        self.procs.append(subprocess.Popen(
            ["ip", "netns", "exec", self.ns, "dnsmasq", "--keep-in-foreground", "--no-resolv",
             "--no-hosts", "--no-poll", "--conf-file=/dev/null", "--bind-interfaces",
             f"--listen-address={DNS_SERVER}", "--pid-file=", "--user=root", *records],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        self.procs.append(subprocess.Popen(
            ["ip", "netns", "exec", self.ns, "python3", "-m", "http.server", str(PEER_PORT)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.time() + 30
        while not all(x in sh(f"ip netns exec {self.ns} ss -tuln").stdout
                      for x in (f"{DNS_SERVER}:53", f":{PEER_PORT}")):
            assert time.time() < deadline, "DNS or HTTP server of the peer did not start"
            time.sleep(0.1)
        return self

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()
        sh(f"ip netns del {self.ns}")  # takes the veth with it


def sandbox_links() -> list[str]:
    """Host ends of sandbox veths (``dsv*``) that exist now."""
    out = sh("ip -o link show").stdout
    return [ln.split(":")[1].strip().split("@")[0] for ln in out.splitlines()
            if ln.split(":")[1].strip().startswith("dsv")]


HTTP_GET = f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 {PEER} {PEER_PORT} | head -1"


def wait_links_gone(names: set[str], timeout: float = 30) -> set[str]:
    """The names still present after waiting: a dead namespace's veth goes asynchronously."""
    deadline = time.time() + timeout
    while (left := names & set(sandbox_links())) and time.time() < deadline:
        time.sleep(0.1)
    return left


# The net fixtures are defined in redteam/conftest.py and imported by tests/node too, so
# pytest may hold two session instances: they share one server and one peer (two nodes
# with one sandbox subnet on one host would fight over its routes).
_shared: dict[str, list] = {}


def acquire(name: str, factory):
    if name not in _shared:
        _shared[name] = [factory(), 0]
    _shared[name][1] += 1
    return _shared[name][0]


def release(name: str, destroy) -> None:
    entry = _shared[name]
    entry[1] -= 1
    if entry[1] == 0:
        del _shared[name]
        destroy(entry[0])


async def gateway_of(sb) -> str:
    """The host end of a sandbox's veth (its /30's first address)."""
    import ipaddress
    return str(ipaddress.IPv4Address((await sb.network()).address) - 1)
