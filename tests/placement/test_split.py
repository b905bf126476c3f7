"""Splitting a batch over nodes by free room, and rendezvous choice: pure, with hypothesis."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dsec.placement.admission import AdmissionPolicy, NodeLoad, room
from dsec.placement.choose import rendezvous, split_batch

POLICY = AdmissionPolicy(max_sandboxes=4096, memory_overcommit=8.0, cpu_overcommit=64.0)


def node(i: int, sandboxes: int, reserved_mb: int, cpu: float | None = None) -> NodeLoad:
    return NodeLoad(node_id=f"node-{i:04x}", backends=("container",), cpus=2,
                    memory_mb=24_000, sandboxes=sandboxes, memory_reserved_mb=reserved_mb,
                    cpu_reserved=sandboxes * 0.01 if cpu is None else cpu)


loads_st = st.lists(st.tuples(st.integers(0, 4096), st.integers(0, 200_000)),
                    min_size=1, max_size=40).map(
    lambda xs: [node(i, s, m) for i, (s, m) in enumerate(xs)])


@settings(deadline=None)  # pure and fast; a loaded CI machine must not fail it
@given(loads_st, st.integers(1, 40_000), st.integers(16, 2048))
def test_split_never_overfills_and_places_all_that_fits(loads, count, mem):
    shares, left = split_batch(loads, "container", mem, 0.1, count, policy=POLICY)
    rooms = {n.node_id: room(n, "container", mem, 0.1, POLICY) for n in loads}
    assert all(0 < v <= rooms[k] for k, v in shares.items())
    assert sum(shares.values()) + left == count
    assert sum(shares.values()) == min(count, sum(rooms.values()))


@settings(deadline=None)
@given(loads_st, st.integers(1, 40_000))
def test_split_is_proportional_to_room_within_one(loads, count):
    shares, _ = split_batch(loads, "container", 64, 0.1, count, policy=POLICY)
    rooms = {n.node_id: room(n, "container", 64, 0.1, POLICY) for n in loads}
    total, placed = sum(rooms.values()), sum(shares.values())
    for k, r in rooms.items():
        if total:
            assert abs(shares.get(k, 0) - placed * r / total) < 1.0 + 1e-9


def test_pending_placements_take_room_away():
    loads = [node(0, 0, 0), node(1, 0, 0)]
    shares, _ = split_batch(loads, "container", 64, 0.1, 100,
                            pending={"node-0000": 4096}, policy=POLICY)
    assert shares == {"node-0001": 100}


def test_a_batch_bigger_than_the_cluster_leaves_the_rest_over():
    loads = [node(0, 4090, 0, cpu=0.0), node(1, 4000, 0, cpu=0.0)]
    shares, left = split_batch(loads, "container", 64, 0.1, 200, policy=POLICY)
    assert shares == {"node-0000": 6, "node-0001": 96} and left == 98


def test_no_node_with_the_backend_places_nothing():
    shares, left = split_batch([node(0, 0, 0)], "microvm", 64, 0.1, 5, policy=POLICY)
    assert shares == {} and left == 5


@settings(deadline=None)
@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=50, unique=True), st.text(
    min_size=1, max_size=20))
def test_rendezvous_is_stable_and_moves_only_the_leavers_keys(ids, key):
    loads = [node(i, 0, 0) for i in ids]
    first = rendezvous(loads, key)
    assert rendezvous(list(reversed(loads)), key) == first
    others = [n for n in loads if n != loads[0]]
    if first != loads[0] and others:
        assert rendezvous(others, key) == first
