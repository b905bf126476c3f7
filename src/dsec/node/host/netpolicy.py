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
     "permissions": {"docs": {"addresses": ["192.0.2.0/24"], "ports": [443]},
                     "pypi": {"domains": ["pypi.org", "files.pythonhosted.org"],
                              "ports": [443]}},
     "dns_upstreams": ["192.0.2.53"]}

A permission's ``domains`` are resolved by the node for the sandbox (:mod:`dsec.node.host.dns`):
only addresses it resolved for them enter the sandbox's allow set. ``dns_upstreams`` (the
node's own ``/etc/resolv.conf`` when empty) are the resolvers the node asks.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from dsec.api.errors import DSecError, Internal, InvalidArgument, Unsupported
from dsec.api.rl import DeniedFlow
from dsec.node.host.dns import DnsProxy, check_domain, host_upstreams, set_name

__all__ = ["Permission", "NetworkConfig", "NetworkManager", "render_sandbox_table",
           "render_allow", "render_host_tables", "slot_addresses", "next_slot", "host_tables",
           "netns_of"]

log = logging.getLogger("dsec.node")



def host_tables(prefix: str) -> tuple[tuple[str, str], ...]:
    """(family, name) of the host tables of the node whose interfaces are ``dsv<prefix>*``."""
    return (("inet", f"dsec_{prefix}"), ("ip", f"dsec_{prefix}_nat"))


class Permission(BaseModel):
    """One named permission: destinations a sandbox may reach when it holds it."""

    model_config = ConfigDict(extra="forbid")
    addresses: list[str] = Field(default_factory=list, description="IPv4 addresses or CIDR blocks")
    domains: list[str] = Field(default_factory=list,
                               description="domain names (each with its subdomains) whose "
                                           "addresses, as the node resolves them, are allowed")
    ports: list[int] = Field(default_factory=list, description="allowed ports; [] for any")
    protocols: list[Literal["tcp", "udp"]] = Field(default_factory=lambda: ["tcp", "udp"])

    @field_validator("addresses")
    @classmethod
    def _cidrs(cls, v: list[str]) -> list[str]:
        return [str(ipaddress.IPv4Network(a, strict=False)) for a in v]

    @field_validator("domains")
    @classmethod
    def _domains(cls, v: list[str]) -> list[str]:
        return [check_domain(d) for d in v]

    @model_validator(mode="after")
    def _something(self) -> Permission:
        if not self.addresses and not self.domains:
            raise ValueError("a permission needs at least one address or domain")
        return self


class NetworkConfig(BaseModel):
    """The node's egress configuration."""

    model_config = ConfigDict(extra="forbid")
    subnet: str = Field("10.213.0.0/16", description="sandbox addresses, a /30 each")
    build_subnet: str = Field("10.212.255.0/24",
                              description="addresses of Dockerfile builds granted a network "
                                          "permission, a /30 each (apart from the sandboxes')")
    permissions: dict[str, Permission] = Field(default_factory=dict)
    dns_upstreams: list[str] = Field(
        default_factory=list, description="'ip' or 'ip:port' of the resolvers the node asks "
                                          "for domain permissions; empty: its resolv.conf")

    def upstreams(self) -> list[tuple[str, int]]:
        out = []
        for u in self.dns_upstreams:
            host, _, port = u.partition(":")
            out.append((str(ipaddress.IPv4Address(host)), int(port or 53)))
        return out or host_upstreams()

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


def render_allow(allow: dict[str, bool], perms: dict[str, Permission],
                 dns_to: str | None = None) -> str:
    """The nft commands that refill the ``allow`` chain for these permissions.

    With ``dns_to`` (the host end of the sandbox's veth) the ``dns`` nat chain is refilled
    too: when a granted permission names domains, DNS to any address goes to the node's
    resolver there, and each such permission accepts the addresses of its set."""
    names = sorted(perms)
    granted = sorted(n for n, on in allow.items() if on)
    lines = []
    if dns_to is not None:
        lines += ["add chain inet dsec dns { type nat hook output priority -100; policy accept; }",
                  "flush chain inet dsec dns"]
    lines.append("flush chain inet dsec allow")
    if dns_to is not None and any(perms[n].domains for n in granted):
        lines += [f"add rule inet dsec dns ip daddr != 127.0.0.0/8 meta l4proto {{ tcp, udp }} "
                  f"th dport 53 dnat ip to {dns_to}",
                  f"add rule inet dsec allow ip daddr {dns_to} meta l4proto {{ tcp, udp }} "
                  "th dport 53 accept"]
    for name in granted:
        p = perms[name]
        where = []
        if p.addresses:
            where.append(f"ip daddr {{ {', '.join(p.addresses)} }}")
        if p.domains and dns_to is not None:
            s = set_name(names.index(name))
            lines.insert(0, f"add set inet dsec {s} {{ type ipv4_addr; flags timeout; }}")
            where.append(f"ip daddr @{s}")
        for w in where:
            rule = f"add rule inet dsec allow {w} meta l4proto {{ {', '.join(p.protocols)} }}"
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


def render_host_tables(prefix: str, subnet: str | None = None) -> str:
    """The host tables of one node: its veths are ``dsv<prefix>*``; with ``subnet``, DNS to
    the host ends of its veths (the node's resolvers, :mod:`dsec.node.host.dns`) passes."""
    (_, filt), (_, nat) = host_tables(prefix)
    mine = f'"dsv{prefix}*"'
    dns = (f"\n    iifname {mine} ip daddr {subnet} meta l4proto {{ tcp, udp }} th dport 53 accept"
           if subnet else "")
    return f"""table inet {filt} {{
  chain input {{
    type filter hook input priority 0; policy accept;
    iifname {mine} ct state established,related accept{dns}
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
        self._dns: DnsProxy | None = None
        # rec -> its FileOps (set by the node): the resolv.conf of a sandbox given domains
        self.files_of: Callable | None = None

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
                await self._resolve_for(rec, allow)
                return
        host_ip = slot_addresses(self.config.subnet, rec.runtime["net"]["slot"])[0]
        await _run(*_in_netns(ns, "nft", "-f", "-"),
                   stdin=render_allow(allow, self.config.permissions, host_ip))
        await self._resolve_for(rec, allow)

    def _domains_granted(self, allow: dict[str, bool]) -> bool:
        return any(on and self.config.permissions[n].domains for n, on in allow.items())

    async def _resolve_for(self, rec, allow: dict[str, bool]) -> None:
        """Start the sandbox's resolver (and name it in its resolv.conf) once a granted
        permission names domains; it reads the sandbox's permissions live from then on."""
        if not self._domains_granted(allow):
            return
        if self._dns is None:
            self._dns = DnsProxy(self.config.upstreams())
        host_ip, sb_ip = slot_addresses(self.config.subnet, rec.runtime["net"]["slot"])
        ns = netns_of(rec)
        perms = self.config.permissions

        def policy():
            net = rec.spec.network
            return ({} if net == "none" else net), perms

        async def allow_in(commands: str) -> None:
            await _run(*_in_netns(ns, "nft", "-f", "-"), stdin=commands)

        await self._dns.ensure(rec.id, host_ip, sb_ip, policy, allow_in)
        if self.files_of is not None:
            await asyncio.to_thread(_write_resolv, self.files_of(rec), host_ip)

    async def recover(self, records) -> None:
        """Resolvers of the sandboxes found again after a restart (they kept their rules)."""
        for rec in records:
            if "net" in rec.runtime and rec.spec.network != "none":
                try:
                    await self._resolve_for(rec, rec.spec.network)
                except (OSError, DSecError) as exc:
                    log.warning("no resolver for %s: %s", rec.id, exc)

    def refused_names(self, rec) -> dict[str, int]:
        """Names the sandbox asked for and was refused, with how many times."""
        return self._dns.refused(rec.id) if self._dns else {}

    def forget(self, rec) -> dict[str, int]:
        """Close the sandbox's resolver (it is stopping); what it refused."""
        return self._dns.forget(rec.id) if self._dns else {}

    async def plumb(self, ns: str, slot: int, allow: dict[str, bool]) -> None:
        """Give the namespace file ``ns`` the veth of ``slot`` and the rules of ``allow``
        (a Dockerfile build's namespace: :mod:`dsec.node.host.buildnet`)."""
        await self._plumb(ns, slot, allow)

    async def resolve_for(self, rec, allow: dict[str, bool]) -> None:
        """Start the resolver of ``rec`` if a permission of ``allow`` names domains."""
        await self._resolve_for(rec, allow)

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
                   stdin=render_sandbox_table() + render_allow(allow, self.config.permissions,
                                                               host_ip))

    async def _host_tables(self) -> None:
        # Checked at every attach (one nft call): the tables are this node's, but an
        # operator may have flushed the ruleset.
        Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")
        listed = await _run("nft", "list", "tables")
        if any(f"table {fam} {name}\n" not in listed + "\n"
               for fam, name in host_tables(self.prefix)):
            await self._drop_host_tables(listed)
            await _run("nft", "-f", "-", stdin=render_host_tables(self.prefix,
                                                                  self.config.subnet))

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
        if self._dns is not None:
            self._dns.close()
        links = await _run("ip", "-o", "link", "show")
        mine = f"dsv{self.prefix}"
        if any(line.split(":")[1].strip().startswith(mine) for line in links.splitlines()):
            return
        await self._drop_host_tables(await _run("nft", "list", "tables"))

    async def _drop_host_tables(self, listed: str) -> None:
        for family, name in host_tables(self.prefix):
            if f"table {family} {name}\n" in listed + "\n":
                await _run("nft", "delete", "table", family, name)


def _write_resolv(files, host_ip: str) -> None:
    files.mkdir("/etc")
    with files.open_write("/etc/resolv.conf") as f:
        f.write(f"nameserver {host_ip}\n".encode())


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
