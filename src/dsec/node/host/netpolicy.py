"""Egress by named permissions, enforced with nftables inside each sandbox's network namespace.

The namespace is a container's (its init's) or a guest's own, where its QEMU runs: the
guest's connections leave as QEMU's sockets there, so one set of rules serves every backend.

A sandbox created with ``network="none"`` keeps runc's fresh namespace with loopback only:
no route leaves it. A sandbox with permissions (even all false) gets a veth pair: ``eth0``
inside with a /30 from the node's sandbox subnet, ``dsv<node><n>`` on the host, NAT on
the way out. Inside its namespace a ``inet dsec`` table accepts what the permissions allow and
refuses (TCP reset, else ICMP admin-prohibited) and counts everything else, remembering
each refused destination with a packet count. The sandbox lacks CAP_NET_ADMIN, so it
cannot change its own rules. On the host, each node has its own two tables
(``dsec_<node>`` and ``dsec_<node>_nat``): traffic from its veths to the host itself or to
any sandbox is dropped, whatever the sandbox's own table says. A node removes only its own
tables, when it closes with no veth left.

Permission names map to address sets in ``<state_dir>/network.json`` (two nodes on one
host need two subnets: each routes its own /30s through its own veths)::

    {"subnet": "10.213.0.0/16",
     "permissions": {"pypi": {"addresses": ["192.0.2.0/24"], "ports": [443]}}}
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from dsec.api.errors import Internal, InvalidArgument, Unsupported
from dsec.api.rl import DeniedFlow

__all__ = ["Permission", "NetworkConfig", "NetworkManager", "render_sandbox_table",
           "render_allow", "render_host_tables", "slot_addresses", "next_slot", "host_tables",
           "netns_of"]



def host_tables(prefix: str) -> tuple[tuple[str, str], ...]:
    """(family, name) of the host tables of the node whose interfaces are ``dsv<prefix>*``."""
    return (("inet", f"dsec_{prefix}"), ("ip", f"dsec_{prefix}_nat"))


class Permission(BaseModel):
    """One named permission: destinations a sandbox may reach when it holds it."""

    model_config = ConfigDict(extra="forbid")
    addresses: list[str] = Field(description="IPv4 addresses or CIDR blocks")
    ports: list[int] = Field(default_factory=list, description="allowed ports; [] for any")
    protocols: list[Literal["tcp", "udp"]] = Field(default_factory=lambda: ["tcp", "udp"])

    @field_validator("addresses")
    @classmethod
    def _cidrs(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("a permission needs at least one address")
        return [str(ipaddress.IPv4Network(a, strict=False)) for a in v]


class NetworkConfig(BaseModel):
    """The node's egress configuration."""

    model_config = ConfigDict(extra="forbid")
    subnet: str = Field("10.213.0.0/16", description="sandbox addresses, a /30 each")
    permissions: dict[str, Permission] = Field(default_factory=dict)

    @classmethod
    def load(cls, state_dir: Path) -> NetworkConfig:
        path = state_dir / "network.json"
        return cls.model_validate_json(path.read_text()) if path.exists() else cls()


# ---- rendering (pure) ----
def slot_addresses(subnet: str, slot: int) -> tuple[str, str]:
    """(host end, sandbox end) of the /30 number ``slot`` of ``subnet``."""
    net = ipaddress.IPv4Network(subnet)
    if (slot + 1) * 4 > net.num_addresses:
        raise InvalidArgument(f"no free sandbox address left in {subnet}")
    base = net.network_address + slot * 4
    return str(base + 1), str(base + 2)


def render_allow(allow: dict[str, bool], perms: dict[str, Permission]) -> str:
    """The nft commands that refill the ``allow`` chain for these permissions."""
    lines = ["flush chain inet dsec allow"]
    for name in sorted(n for n, on in allow.items() if on):
        p = perms[name]
        rule = f"add rule inet dsec allow ip daddr {{ {', '.join(p.addresses)} }}"
        rule += f" meta l4proto {{ {', '.join(p.protocols)} }}"
        if p.ports:
            rule += f" th dport {{ {', '.join(str(x) for x in sorted(p.ports))} }}"
        lines.append(rule + " accept")
    return "\n".join(lines) + "\n"


def render_sandbox_table() -> str:
    return """table inet dsec {
  counter dropped { }
  set denied { type ipv4_addr . inet_proto . inet_service; size 4096; flags dynamic; counter; }
  chain allow { }
  chain output {
    type filter hook output priority 0; policy accept;
    oifname "lo" accept
    ct state established,related accept
    jump allow
    meta l4proto { tcp, udp } update @denied { ip daddr . meta l4proto . th dport }
    counter name "dropped"
    meta l4proto tcp reject with tcp reset
    reject with icmpx admin-prohibited
  }
}
"""


def render_host_tables(prefix: str) -> str:
    """The host tables of one node: its veths are ``dsv<prefix>*``."""
    (_, filt), (_, nat) = host_tables(prefix)
    mine = f'"dsv{prefix}*"'
    return f"""table inet {filt} {{
  chain input {{
    type filter hook input priority 0; policy accept;
    iifname {mine} ct state established,related accept
    iifname {mine} counter drop
  }}
  chain forward {{
    type filter hook forward priority 0; policy accept;
    iifname {mine} oifname "dsv*" counter drop
  }}
}}
table ip {nat} {{
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    iifname {mine} oifname != "dsv*" masquerade random
  }}
}}
"""


# ---- I/O ----
async def _run(*argv: str, stdin: str | None = None) -> str:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate(stdin.encode() if stdin is not None else None)
    if proc.returncode != 0:
        raise Internal(f"{' '.join(argv[:4])} failed: {err.decode(errors='replace').strip()}")
    return out.decode()


def _in_netns(ns: str, *argv: str) -> tuple[str, ...]:
    return ("nsenter", f"--net={ns}", *argv)


def netns_of(rec) -> str:
    """The file naming a sandbox's network namespace: a guest's own (``runtime["netns"]``,
    where its QEMU runs) or a container's init's."""
    if "netns" in rec.runtime:
        return rec.runtime["netns"]
    if "init_pid" in rec.runtime:
        return f"/proc/{rec.runtime['init_pid']}/ns/net"
    raise Unsupported(f"network permissions are not available on {rec.spec.backend} "
                      f"sandboxes")


class NetworkManager:
    """Gives sandboxes egress and changes it while they run."""

    def __init__(self, state_dir: Path, node_short: str) -> None:
        self.state_dir = state_dir
        self.prefix = node_short[:7]  # dsv<node><slot> fits IFNAMSIZ (15) up to slot 99999
        self._config: NetworkConfig | None = None
        self._lock = asyncio.Lock()
        self._next_slot = 0

    @property
    def config(self) -> NetworkConfig:
        if self._config is None:
            self._config = NetworkConfig.load(self.state_dir)
        return self._config

    def check(self, allow: dict[str, bool]) -> None:
        unknown = sorted(set(allow) - set(self.config.permissions))
        if unknown:
            raise InvalidArgument(f"unknown network permission(s) {unknown}; this node "
                                  f"offers {sorted(self.config.permissions)}")

    async def attach(self, rec, records) -> None:
        """Give ``rec`` a veth and its rules, if its spec asks for any network."""
        if rec.spec.network == "none":
            return
        await self.set(rec, rec.spec.network, records)

    async def set(self, rec, allow: dict[str, bool], records) -> None:
        """Apply ``allow`` to a running (or paused) sandbox, adding its veth if needed."""
        self.check(allow)
        ns = netns_of(rec)
        async with self._lock:
            if "net" not in rec.runtime:
                slot = next_slot({r.runtime["net"]["slot"] for r in records
                                  if "net" in r.runtime}, self._next_slot,
                                 ipaddress.IPv4Network(self.config.subnet).num_addresses // 4)
                self._next_slot = slot + 1
                await self._plumb(ns, slot, allow)
                rec.runtime["net"] = {"slot": slot,
                                      "address": slot_addresses(self.config.subnet, slot)[1]}
                return
        await _run(*_in_netns(ns, "nft", "-f", "-"),
                   stdin=render_allow(allow, self.config.permissions))

    async def _plumb(self, ns: str, slot: int, allow: dict[str, bool]) -> None:
        """Veth, addresses, route and rules: three commands, the namespace's side in one."""
        host_ip, sb_ip = slot_addresses(self.config.subnet, slot)
        await self._host_tables()
        host, peer = f"dsv{self.prefix}{slot}", f"dsp{self.prefix}{slot}"
        # A stopped sandbox's namespace is torn down by the kernel asynchronously: its veth
        # may outlive it briefly. No record holds this slot, so such a link is stale.
        stale = f"link del {host}\n" if Path(f"/sys/class/net/{host}").exists() else ""
        await _run("ip", "-batch", "-", stdin=(
            f"{stale}link add {host} type veth peer name {peer} netns {ns}\n"
            f"addr add {host_ip}/30 dev {host}\nlink set {host} up\n"))
        # IPv4 only: IPv6 neighbour discovery would otherwise fill the drop counter.
        script = (f"echo 1 > /proc/sys/net/ipv6/conf/{peer}/disable_ipv6 && "
                  f"ip link set {peer} name eth0 && ip addr add {sb_ip}/30 dev eth0 && "
                  f"ip link set eth0 up && ip route add default via {host_ip} && nft -f -")
        await _run(*_in_netns(ns, "sh", "-c", script),
                   stdin=render_sandbox_table() + render_allow(allow, self.config.permissions))

    async def _host_tables(self) -> None:
        # Checked at every attach (one nft call): the tables are this node's, but an
        # operator may have flushed the ruleset.
        Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")
        listed = await _run("nft", "list", "tables")
        if any(f"table {fam} {name}\n" not in listed + "\n"
               for fam, name in host_tables(self.prefix)):
            await self._drop_host_tables(listed)
            await _run("nft", "-f", "-", stdin=render_host_tables(self.prefix))

    async def status(self, rec) -> tuple[int, list[DeniedFlow]]:
        """Packets refused so far, and each refused destination with its packet count."""
        if "net" not in rec.runtime:
            return 0, []
        ns = netns_of(rec)
        counter = json.loads(await _run(*_in_netns(ns, "nft", "-j", "list", "counter",
                                                   "inet", "dsec", "dropped")))
        dropped = next(x["counter"]["packets"] for x in counter["nftables"] if "counter" in x)
        listing = json.loads(await _run(*_in_netns(ns, "nft", "-j", "list", "set", "inet",
                                                   "dsec", "denied")))
        return dropped, _denied_flows(listing)

    async def close(self) -> None:
        """Drop this node's host tables when none of its sandboxes has a veth any more."""
        links = await _run("ip", "-o", "link", "show")
        mine = f"dsv{self.prefix}"
        if any(line.split(":")[1].strip().startswith(mine) for line in links.splitlines()):
            return
        await self._drop_host_tables(await _run("nft", "list", "tables"))

    async def _drop_host_tables(self, listed: str) -> None:
        for family, name in host_tables(self.prefix):
            if f"table {family} {name}\n" in listed + "\n":
                await _run("nft", "delete", "table", family, name)


def next_slot(used: set[int], start: int, capacity: int) -> int:
    """The first free slot from ``start`` on, wrapping; pure.

    Slots go round-robin rather than lowest-free: a sandbox's address is not handed to the
    next sandbox at once, so a new connection never meets the last one's TIME_WAIT state
    (same address and, in a fresh namespace, the same source port) at a peer."""
    for i in range(capacity):
        slot = (start + i) % capacity
        if slot not in used:
            return slot
    raise InvalidArgument(f"all {capacity} sandbox addresses of this node are in use")


def _denied_flows(listing: dict) -> list[DeniedFlow]:
    out = []
    for item in listing["nftables"]:
        for elem in item.get("set", {}).get("elem", []):
            e = elem.get("elem", elem)
            addr, proto, port = e["val"]["concat"]
            packets = (e.get("counter") or {}).get("packets", 0)
            out.append(DeniedFlow(address=addr, protocol=str(proto), port=int(port),
                                  packets=packets))
    return out
