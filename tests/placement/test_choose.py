import random

from hypothesis import given
from hypothesis import strategies as st

from dsec.placement.admission import AdmissionPolicy, NodeLoad, admit, room
from dsec.placement.choose import choose_node, refusal


def node(i, sandboxes=0, reserved=0, backends=("container",)):
    return NodeLoad(node_id=f"node-{i}", backends=backends, cpus=2, memory_mb=1000,
                    sandboxes=sandboxes, memory_reserved_mb=reserved, cpu_reserved=0)


def test_admission_refuses_a_full_node():
    policy = AdmissionPolicy(max_sandboxes=2)
    assert admit(node(0, sandboxes=2), "container", 10, 1, policy) is not None
    assert admit(node(0, sandboxes=1), "container", 10, 1, policy) is None


def test_admission_refuses_a_missing_backend():
    assert "no 'vm' backend" in admit(node(0), "vm", 10, 1)


def test_admission_counts_a_batch():
    policy = AdmissionPolicy(max_sandboxes=10)
    assert admit(node(0, sandboxes=5), "container", 10, 1, policy, count=6) is not None


def test_choose_skips_nodes_without_room():
    policy = AdmissionPolicy(max_sandboxes=3)
    loads = [node(0, sandboxes=3), node(1, sandboxes=0)]
    for seed in range(20):
        got = choose_node(loads, "container", 10, 1, rng=random.Random(seed), policy=policy)
        assert got.node_id == "node-1"


def test_choose_returns_none_when_nothing_fits():
    assert choose_node([node(0, backends=("vm",))], "container", 10, 1) is None


def test_recent_placements_spread_a_burst():
    loads = [node(0), node(1)]
    recent = {"node-0": 50}
    got = choose_node(loads, "container", 10, 1, recent=recent, k=2, rng=random.Random(1))
    assert got.node_id == "node-1"


@given(st.lists(st.integers(0, 100), min_size=1, max_size=8), st.integers(0, 10_000))
def test_choice_is_always_an_admissible_node(sizes, seed):
    policy = AdmissionPolicy(max_sandboxes=50)
    loads = [node(i, sandboxes=s) for i, s in enumerate(sizes)]
    got = choose_node(loads, "container", 10, 1, rng=random.Random(seed), policy=policy)
    fits = [n for n in loads if n.sandboxes < 50]
    if fits:
        assert got in fits
    else:
        assert got is None


def test_a_refusal_names_the_limit_that_was_hit():
    cpu_bound = NodeLoad("node-c", ("container",), cpus=2, memory_mb=65536, sandboxes=0,
                         memory_reserved_mb=0, cpu_reserved=0.0)
    old = AdmissionPolicy(memory_overcommit=8.0, cpu_overcommit=64.0)
    msg = refusal([cpu_bound], "container", memory_mb=64, cpu=2, count=65, policy=old)
    assert "CPUs reserved of 128" in msg and "65 x 2 CPUs" in msg and "MiB reserved" not in msg
    mem_bound = NodeLoad("node-m", ("container",), cpus=64, memory_mb=1024, sandboxes=0,
                         memory_reserved_mb=8000, cpu_reserved=0.0)
    msg = refusal([mem_bound], "container", memory_mb=512, cpu=1, policy=old)
    assert "MiB reserved of 8192" in msg and "CPUs reserved" not in msg
    assert "no 'fncall' backend" in refusal([mem_bound], "fncall", 64, 1)
    assert "there are no nodes" in refusal([], "container", 64, 1)


def test_a_refusal_counts_what_this_gateway_just_placed():
    """Room the loads show, taken by placements they do not show yet, is no "retry"."""
    n = node(1)
    free = room(n, "container", 100, 0.1, AdmissionPolicy())
    assert "has room again; retry" in refusal([n], "container", 100, 0.1)
    msg = refusal([n], "container", 100, 0.1, pending={"node-1": free})
    assert "retry" not in msg and f"full with the {free} sandbox(es) just placed" in msg
    assert "has room again" in refusal([n], "container", 100, 0.1, pending={"node-1": free - 1})
