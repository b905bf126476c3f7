"""Placement: pick a node for a sandbox. Pure: the caller supplies loads and randomness.

Filter the nodes that have the backend and room (admission), then power-of-k-choices on
load, where load counts the gateway's own recent placements too, so several gateways
(or one gateway placing a burst) do not all pile onto the node that looked emptiest.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence

from dsec.placement.admission import AdmissionPolicy, NodeLoad, admit, room

__all__ = ["choose_node", "score", "refusal", "split_batch", "rendezvous"]


def score(load: NodeLoad, recent: int) -> float:
    """Lower is better: reserved memory share plus the placements not yet visible in load."""
    mem = load.memory_reserved_mb / max(load.memory_mb, 1)
    return mem + (load.sandboxes + recent) / 1000.0


def choose_node(loads: Sequence[NodeLoad], backend: str, memory_mb: int, cpu: float,
                recent: Mapping[str, int] | None = None, k: int = 2,
                rng: random.Random | None = None,
                policy: AdmissionPolicy = AdmissionPolicy(),
                exclude: frozenset[str] = frozenset()) -> NodeLoad | None:
    """The chosen node, or None when no node can take the sandbox.

    ``k`` nodes are drawn first and only they are asked whether they admit it: the cost
    of a choice does not grow with the cluster (a filter over 160 nodes per create was
    most of placement's time). Only when none of the drawn nodes can take it are all the
    nodes filtered, and ``k`` drawn from those that can."""
    recent = recent or {}
    rng = rng or random.Random()

    def fits(n: NodeLoad) -> bool:
        return n.node_id not in exclude and admit(n, backend, memory_mb, cpu, policy) is None

    drawn = [n for n in rng.sample(loads, min(k, len(loads))) if fits(n)] if loads else []
    if not drawn:
        able = [n for n in loads if fits(n)]
        if not able:
            return None
        drawn = rng.sample(able, min(k, len(able)))
    return min(drawn, key=lambda n: score(n, recent.get(n.node_id, 0)))


def refusal(loads: Sequence[NodeLoad], backend: str, memory_mb: int, cpu: float,
            count: int = 1, policy: AdmissionPolicy = AdmissionPolicy(),
            exclude: frozenset[str] = frozenset(),
            pending: Mapping[str, int] | None = None) -> str:
    """Why no node can take ``count`` sandboxes of this size: each node's own reason, so
    the caller learns which limit (memory, CPUs, sandboxes, backend) to change. A node
    the loads show room on, taken by this gateway's placements they do not show yet
    (``pending``), says so: not "has room again; retry". Pure."""
    reasons = []
    pending = pending or {}
    for n in loads:
        placed = pending.get(n.node_id, 0)
        if n.node_id in exclude:
            reasons.append(f"node {n.node_id} refused it already")
        elif why := admit(n, backend, memory_mb, cpu, policy, count=count):
            reasons.append(why)
        elif placed and room(n, backend, memory_mb, cpu, policy) - placed < count:
            reasons.append(f"node {n.node_id} is full with the {placed} sandbox(es) just "
                           "placed on it")
        else:
            reasons.append(f"node {n.node_id} has room again; retry")
    head = f"no node can take {count} {backend} sandbox(es) of {cpu:g} CPU and {memory_mb} MiB"
    return f"{head}: " + ("; ".join(reasons) if reasons else "there are no nodes")


def split_batch(loads: Sequence[NodeLoad], backend: str, memory_mb: int, cpu: float,
                count: int, pending: Mapping[str, int] | None = None,
                policy: AdmissionPolicy = AdmissionPolicy()) -> tuple[dict[str, int], int]:
    """Split ``count`` sandboxes over the nodes in proportion to their free room.

    Room is what admission would still let in, less this gateway's placements the loads
    do not show yet (``pending``, counted in sandboxes). Largest remainders round the
    shares, so the result sums to ``min(count, total room)``; nothing goes to a node past
    its room. Returns ``({node_id: share}, left_over)``. Pure."""
    pending = pending or {}
    rooms = {n.node_id: max(0, room(n, backend, memory_mb, cpu, policy)
                            - pending.get(n.node_id, 0)) for n in loads}
    total = sum(rooms.values())
    want = min(count, total)
    if want == 0:
        return {}, count
    exact = {k: want * r / total for k, r in rooms.items()}
    shares = {k: int(v) for k, v in exact.items()}
    short = want - sum(shares.values())
    for k in sorted(exact, key=lambda k: (shares[k] - exact[k], k))[:short]:
        shares[k] += 1
    return {k: v for k, v in shares.items() if v}, count - want


def rendezvous(loads: Sequence[NodeLoad], key: str) -> NodeLoad | None:
    """The node ``key`` hashes highest with (rendezvous hashing): the same node for the
    same key while it is in ``loads``, and only the keys of a node that leaves move. Pure."""
    def weight(n: NodeLoad) -> bytes:
        return hashlib.blake2b(f"{key}\0{n.node_id}".encode(), digest_size=8).digest()
    return max(loads, key=weight, default=None)
