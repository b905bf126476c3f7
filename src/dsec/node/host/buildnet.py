"""Egress for a Dockerfile build's RUN steps, by the node's named permissions.

A build with no permission runs with buildah's ``--network none`` (loopback only). A build
granted permissions (``dsec image build ... --network pypi``) gets a network namespace of
its own, plumbed exactly as a sandbox's (:mod:`dsec.node.host.netpolicy`): a veth with a /30,
NAT on the way out, and the ``inet dsec`` table inside that accepts only what the granted
permissions allow, so a RUN step reaches what a sandbox with the same permissions reaches and
nothing else (not the host itself, not any sandbox). buildah joins it (``--network ns:PATH``).
A permission naming domains also gets the node's resolver for the build (``--dns``).

Builds take their /30s from ``build_subnet`` in ``network.json`` (not the sandboxes'
``subnet``, so a build never holds an address a sandbox is given) and name their veths
``dsvbld<slot>``: the host tables are ``dsec_bld`` / ``dsec_bld_nat``, dropped when the last
build's veth goes. Node prefixes are hex, so ``bld`` is never a node's.
"""

from __future__ import annotations

import asyncio
import fcntl
import ipaddress
import secrets
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from dsec.api.errors import InvalidArgument
from dsec.node.host.netpolicy import NetworkConfig, NetworkManager, slot_addresses

__all__ = ["BuildNetwork", "build_network"]

PREFIX = "bld"


@dataclass
class BuildNetwork:
    """What buildah is given: ``--network`` and, for domain permissions, ``--dns``."""

    network: str = "none"
    dns: str | None = None
    address: str | None = field(default=None, repr=False)

    def buildah_args(self) -> list[str]:
        return ["--network", self.network] + (["--dns", self.dns] if self.dns else [])


def _sh(*argv: str) -> None:
    res = subprocess.run(argv, capture_output=True, text=True)
    if res.returncode != 0:
        raise InvalidArgument(f"{' '.join(argv)} failed: {res.stderr.strip()}")


class _Loop:
    """An event loop in a thread: the node's resolver serves the build while buildah runs."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


def _free_slot(capacity: int) -> int:
    for slot in range(capacity):
        if not Path(f"/sys/class/net/dsv{PREFIX}{slot}").exists():
            return slot
    raise InvalidArgument(f"all {capacity} build addresses are in use; wait for a build to "
                          f"end or give network.json a larger build_subnet")


@contextmanager
def build_network(state_dir: Path, allow: dict[str, bool]) -> Iterator[BuildNetwork]:
    """The network a build's RUN steps get for the permissions ``allow`` (names from the
    node's ``network.json``); torn down on exit. Unknown names are an InvalidArgument."""
    mgr = NetworkManager(state_dir, PREFIX)
    mgr.check(allow)
    if not any(allow.values()):
        yield BuildNetwork()
        return
    config: NetworkConfig = mgr.config
    mgr._config = config.model_copy(update={"subnet": config.build_subnet})
    capacity = ipaddress.IPv4Network(config.build_subnet).num_addresses // 4
    ns = f"dsec-build-{secrets.token_hex(4)}"
    rec = SimpleNamespace(id=ns, spec=SimpleNamespace(network=allow),
                          runtime={"netns": f"/run/netns/{ns}"})
    loop = _Loop()
    plumbed = None
    try:
        _sh("ip", "netns", "add", ns)
        # One build at a time picks a slot and creates its veth (which marks the slot taken).
        with open(Path(state_dir) / "build-net.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            slot = _free_slot(capacity)
            loop.run(mgr.plumb(rec.runtime["netns"], slot, allow))
            plumbed = slot
        host_ip, build_ip = slot_addresses(config.build_subnet, slot)
        rec.runtime["net"] = {"slot": slot, "address": build_ip}
        loop.run(mgr.resolve_for(rec, allow))
        dns = host_ip if any(on and config.permissions[n].domains
                             for n, on in allow.items()) else None
        yield BuildNetwork(f"ns:{rec.runtime['netns']}", dns, build_ip)
    finally:
        mgr.forget(rec)
        if plumbed is not None:
            subprocess.run(["ip", "link", "del", f"dsv{PREFIX}{plumbed}"], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        try:
            loop.run(mgr.close())
        finally:
            loop.close()
