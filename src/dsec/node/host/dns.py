"""The node's DNS for sandboxes whose permissions name domains: it answers, and opens the way.

A permission may list domains instead of (or beside) addresses, for hosts behind CDNs whose
addresses change: ``{"pypi": {"domains": ["pypi.org", "files.pythonhosted.org"],
"ports": [443]}}``. A sandbox holding one sends its DNS to the node: its ``resolv.conf``
names the host end of its veth, and a nat rule in its own table sends DNS for any other
address there too. For each query the node checks the name against the sandbox's granted
permissions (a domain matches itself and its subdomains), asks its upstream resolver, and
*before* it answers puts every IPv4 address of the answer into that permission's set in the
sandbox's table (``dom_<n>``, with a timeout); the sandbox's allow chain accepts only those
addresses, on the permission's ports. Any other name is answered REFUSED and counted; a
connection to an address nobody resolved is refused and counted as before.

Why a resolver of the node's own (over dnspython) rather than dnsmasq with ``--nftset``:
dnsmasq writes its sets in the network namespace it runs in, and its domain-to-set map is
per process, not per client. A dnsmasq inside the sandbox's namespace would have to send
its upstream queries from there, where the sandbox's root can send the very same packets
(same uids, no mark a sandbox process cannot also set), so DNS itself could not be refused
to the sandbox; a dnsmasq on the host would fill host sets, moving enforcement out of the
sandbox's table (and its counters) into the host's, with one dnsmasq process per sandbox.
Here one asyncio socket pair per sandbox in the node process does it, bound to that
sandbox's host address, answering only that sandbox's own address.
"""

from __future__ import annotations

import asyncio
import collections
import ipaddress
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["matches", "set_name", "granted_sets", "answer_addresses", "render_elements",
           "check_domain", "SandboxDns", "DnsProxy", "MIN_TIMEOUT_S"]

log = logging.getLogger("dsec.node.dns")

MIN_TIMEOUT_S = 600    # an address stays allowed at least this long (clients cache past TTLs)
MAX_TIMEOUT_S = 86400
UPSTREAM_TIMEOUT_S = 3.0
MAX_IN_FLIGHT = 64     # queries of one sandbox being answered at once; more are dropped
MAX_NAMES = 1024       # refused names counted one by one; the rest under "(other)"
_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")


# ---- pure ----
def check_domain(name: str) -> str:
    """A domain as permissions hold it: lower case, no trailing dot, valid labels."""
    d = name.strip().lower().rstrip(".")
    if not d or len(d) > 253 or not all(_LABEL.match(x) for x in d.split(".")):
        raise ValueError(f"{name!r} is not a domain name (labels of a-z, 0-9 and '-')")
    return d


def matches(qname: str, domains: list[str]) -> bool:
    """``qname`` is one of ``domains`` or a subdomain of one."""
    q = qname.lower().rstrip(".")
    return any(q == d or q.endswith("." + d) for d in domains)


def set_name(index: int) -> str:
    """The sandbox-table set of the permission at ``index`` in sorted permission names."""
    return f"dom_{index}"


def granted_sets(qname: str, allow: dict[str, bool], perms: dict) -> list[str]:
    """Sets of the granted permissions whose domains ``qname`` matches; [] is a refusal."""
    return [set_name(i) for i, name in enumerate(sorted(perms))
            if allow.get(name) and perms[name].domains and matches(qname, perms[name].domains)]


def answer_addresses(response) -> list[tuple[str, int]]:
    """(IPv4 address, TTL) of every A record in a dnspython response's answer section (the
    end of a CNAME chain from the asked name: a CDN's address)."""
    import dns.rdatatype
    out = []
    for rrset in response.answer:
        if rrset.rdtype == dns.rdatatype.A:
            out += [(r.address, int(rrset.ttl)) for r in rrset]
    return out


def render_elements(sets: list[str], addrs: list[tuple[str, int]]) -> str:
    """nft commands putting ``addrs`` into ``sets`` with a fresh timeout each: add (so the
    element exists), delete, add again (an existing element's timeout is not renewed by add)."""
    lines = []
    for s in sets:
        for ip, ttl in addrs:
            ipaddress.IPv4Address(ip)
            t = min(max(ttl, MIN_TIMEOUT_S), MAX_TIMEOUT_S)
            elem = f"{{ {ip} timeout {t}s }}"
            lines += [f"add element inet dsec {s} {elem}", f"delete element inet dsec {s} {{ {ip} }}",
                      f"add element inet dsec {s} {elem}"]
    return "\n".join(lines) + "\n" if lines else ""


# ---- I/O ----
@dataclass
class SandboxDns:
    """One sandbox's resolver: a UDP and a TCP socket on its host address, port 53."""

    sandbox_id: str
    listen: str                          # the host end of the sandbox's veth
    client: str                          # the sandbox's own address: the only one answered
    policy: Callable[[], tuple[dict[str, bool], dict]]  # (granted, permissions), read live
    allow_in: Callable[[str], asyncio.Future]           # runs nft commands in its namespace
    upstreams: list[tuple[str, int]]
    refused: collections.Counter = field(default_factory=collections.Counter)
    _fresh: dict[tuple[str, str], float] = field(default_factory=dict)  # (set, ip) -> until
    _udp: asyncio.DatagramTransport | None = None
    _tcp: asyncio.base_events.Server | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._udp, _ = await loop.create_datagram_endpoint(
            lambda: _Udp(self), local_addr=(self.listen, 53))
        self._tcp = await asyncio.start_server(self._serve_tcp, self.listen, 53)

    def close(self) -> None:
        if self._udp is not None:
            self._udp.close()
        if self._tcp is not None:
            self._tcp.close()

    async def answer(self, wire: bytes, peer: str, tcp: bool) -> bytes | None:
        """The reply to one query; None for what is not a query from this sandbox."""
        import dns.exception
        import dns.message
        import dns.rcode
        if peer != self.client:
            return None  # another sandbox reaching this one's address gets nothing
        try:
            q = dns.message.from_wire(wire)
        except dns.exception.DNSException:
            return None
        if not q.question:
            return None
        qname = q.question[0].name.to_text()
        allow, perms = self.policy()
        sets = granted_sets(qname, allow, perms)
        if not sets:
            name = qname.rstrip(".").lower()
            if name not in self.refused and len(self.refused) >= MAX_NAMES:
                name = "(other)"  # a flood of random names must not grow the node's memory
            self.refused[name] += 1
            return _rcode(q, dns.rcode.REFUSED)
        response = await self._ask(q, tcp)
        if response is None:
            return _rcode(q, dns.rcode.SERVFAIL)
        await self._open(sets, answer_addresses(response))
        return response.to_wire()

    async def _ask(self, q, tcp: bool):
        import dns.asyncquery
        import dns.exception
        for host, port in self.upstreams:
            try:
                if tcp:
                    return await dns.asyncquery.tcp(q, host, timeout=UPSTREAM_TIMEOUT_S,
                                                    port=port)
                return await dns.asyncquery.udp(q, host, timeout=UPSTREAM_TIMEOUT_S, port=port)
            except (dns.exception.DNSException, OSError) as exc:
                log.info("upstream %s:%d failed for %s: %s", host, port, self.sandbox_id, exc)
        return None

    async def _open(self, sets: list[str], addrs: list[tuple[str, int]]) -> None:
        """Into the sets before the answer leaves: the connection that follows it passes."""
        now = time.monotonic()
        todo = [(ip, ttl) for ip, ttl in addrs
                if any(self._fresh.get((s, ip), 0) < now + MIN_TIMEOUT_S / 2 for s in sets)]
        if not todo:
            return
        await self.allow_in(render_elements(sets, todo))
        if len(self._fresh) > 4 * MAX_NAMES:
            self._fresh = {k: t for k, t in self._fresh.items() if t > now}
        for s in sets:
            for ip, ttl in todo:
                self._fresh[(s, ip)] = now + min(max(ttl, MIN_TIMEOUT_S), MAX_TIMEOUT_S)

    async def _serve_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        peer = writer.get_extra_info("peername")[0]
        try:
            while True:
                size = int.from_bytes(await reader.readexactly(2), "big")
                reply = await self.answer(await reader.readexactly(size), peer, tcp=True)
                if reply is None:
                    break
                writer.write(len(reply).to_bytes(2, "big") + reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


class _Udp(asyncio.DatagramProtocol):
    def __init__(self, owner: SandboxDns) -> None:
        self.owner = owner
        self.transport: asyncio.DatagramTransport | None = None
        self.tasks: set[asyncio.Task] = set()  # held: the loop keeps only weak references

    def connection_made(self, transport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr) -> None:
        if len(self.tasks) >= MAX_IN_FLIGHT:
            return  # the client retries; the node does not queue without bound
        task = asyncio.ensure_future(self._reply(data, addr))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _reply(self, data: bytes, addr) -> None:
        try:
            reply = await self.owner.answer(data, addr[0], tcp=False)
        except Exception:  # one bad query must not end the sandbox's resolver
            log.exception("dns query of %s failed", self.owner.sandbox_id)
            return
        if reply is not None and self.transport is not None:
            self.transport.sendto(reply, addr)


def _rcode(q, code) -> bytes:
    import dns.message
    r = dns.message.make_response(q)
    r.set_rcode(code)
    return r.to_wire()


class DnsProxy:
    """The node's resolvers, one per sandbox that holds a domain permission."""

    def __init__(self, upstreams: list[tuple[str, int]]) -> None:
        self.upstreams = upstreams
        self.by_sandbox: dict[str, SandboxDns] = {}

    async def ensure(self, sandbox_id: str, listen: str, client: str, policy, allow_in) -> None:
        if sandbox_id in self.by_sandbox:
            return
        r = SandboxDns(sandbox_id, listen, client, policy, allow_in, self.upstreams)
        await r.start()
        self.by_sandbox[sandbox_id] = r

    def refused(self, sandbox_id: str) -> dict[str, int]:
        r = self.by_sandbox.get(sandbox_id)
        return dict(r.refused) if r else {}

    def forget(self, sandbox_id: str) -> dict[str, int]:
        """Close a sandbox's resolver; what it refused, for the audit log."""
        r = self.by_sandbox.pop(sandbox_id, None)
        if r is None:
            return {}
        r.close()
        return dict(r.refused)

    def close(self) -> None:
        for sb_id in list(self.by_sandbox):
            self.forget(sb_id)


def host_upstreams(resolv_conf: str = "/etc/resolv.conf") -> list[tuple[str, int]]:
    """The node's own nameservers, from its resolv.conf."""
    out = []
    try:
        text = open(resolv_conf).read()
    except OSError:
        return out
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver":
            try:
                ipaddress.IPv4Address(parts[1])
            except ValueError:
                continue
            out.append((parts[1], 53))
    return out
