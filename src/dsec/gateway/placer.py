"""Placement as the gateway does it: the pure choice over the watcher's snapshot.

One :class:`Placer` per gateway serves sandbox creates, batches and fncalls alike. It
reads loads from the :class:`~dsec.gateway.watcher.Watcher` (no request per node) and
adds this gateway's own placements that the snapshot does not show yet. The node's
admission has the last word; a caller that hears ``Capacity`` from a node retries with
that node excluded.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable

from dsec.api.errors import Capacity, NodeLost, Unavailable
from dsec.cluster.base import Cluster
from dsec.cluster.nodeclient import NodeClient
from dsec.gateway import metrics
from dsec.gateway.watcher import Watcher
from dsec.placement.admission import AdmissionPolicy, NodeLoad
from dsec.placement.choose import choose_node, refusal, rendezvous, split_batch

__all__ = ["Placer"]


class Placer:
    def __init__(self, cluster: Cluster, watcher: Watcher, k: int = 2,
                 policy: AdmissionPolicy = AdmissionPolicy(),
                 rng: random.Random | None = None) -> None:
        self.cluster, self.watcher, self.k, self.policy = cluster, watcher, k, policy
        self.rng = rng or random.Random()

    def _clients(self) -> dict[str, NodeClient]:
        return {c.node_id: c for c in self.cluster.clients()}

    def _loads(self):
        loads = self.watcher.loads()
        if not loads:
            down = self.watcher.down()
            raise Unavailable("no node is answering" + (
                f" ({len(down)} known, none healthy: {', '.join(sorted(down)[:8])})"
                if down else "; no node agent is registered"))
        pending = self.watcher.pending.counts()
        return loads, pending

    def choose(self, backend: str, memory_mb: int, cpu: float, count: int = 1,
               exclude: Iterable[str] = (), key: str | None = None) -> NodeClient:
        """The node for ``count`` such sandboxes (together), noted as placed there.

        With an idempotency ``key`` the first choice is the node that key hashes to among
        the healthy nodes with the backend (rendezvous hashing), room or not: a retry goes
        where the first attempt went, and that node answers with what it made."""
        t0 = time.perf_counter()
        loads, pending = self._loads()
        exclude = frozenset(exclude)
        chosen = None
        if key is not None:
            chosen = self._keyed(backend, key, exclude)
        chosen = chosen or choose_node(loads, backend, memory_mb * count, cpu * count,
                                       recent=pending, k=self.k, rng=self.rng,
                                       policy=self.policy, exclude=exclude)
        metrics.PLACEMENT_SECONDS.observe(time.perf_counter() - t0)
        if chosen is None:
            raise Capacity(refusal(loads, backend, memory_mb, cpu, count, self.policy,
                                   exclude=exclude))
        self.watcher.pending.add(chosen.node_id, count, self.watcher.clock())
        return self.watcher.client(chosen.node_id) or self._clients()[chosen.node_id]

    def _keyed(self, backend: str, key: str, exclude: frozenset[str]) -> NodeLoad | None:
        """The node ``key`` hashes to among every node known with ``backend``, answering
        or not: when that node does not answer, the first attempt may have made the
        sandbox there, and making it elsewhere would be a second one (NodeLost)."""
        known = [v.load for v in self.watcher.views.values() if v.load is not None
                 and v.node_id not in exclude and backend in v.load.backends]
        first = rendezvous(known, key)
        if first is not None and not self.watcher.healthy(first.node_id):
            raise NodeLost(f"a create with request_id {key[:80]!r} goes to node "
                           f"{first.node_id}, which does not answer: a first attempt may have "
                           "made it there; retry when the node is back, or use another "
                           "request_id for a new sandbox")
        return first

    def split(self, backend: str, memory_mb: int, cpu: float, count: int,
              exclude: Iterable[str] = ()) -> tuple[list[tuple[NodeClient, int]], int]:
        """Shares of a batch by free room, noted as placed; and how many fit nowhere."""
        loads, pending = self._loads()
        exclude = set(exclude)
        loads = [n for n in loads if n.node_id not in exclude]
        shares, left = split_batch(loads, backend, memory_mb, cpu, count, pending, self.policy)
        clients = self._clients()
        now = self.watcher.clock()
        for node_id, n in shares.items():
            self.watcher.pending.add(node_id, n, now)
        return [(clients[k], n) for k, n in shares.items()], left

    def why_not(self, backend: str, memory_mb: int, cpu: float, count: int = 1) -> str:
        loads, pending = self._loads()
        return refusal(loads, backend, memory_mb, cpu, count, self.policy, pending=pending)
