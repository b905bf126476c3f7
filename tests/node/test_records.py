"""The node's records keep running totals of what they reserve (pure)."""

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from dsec.node.records import Records


def rec(memory_mb: int, cpu: float):
    return SimpleNamespace(spec=SimpleNamespace(memory_mb=memory_mb, cpu=cpu))


def test_replacing_a_record_counts_it_once():
    r = Records()
    r["a"] = rec(64, 0.5)
    r["a"] = rec(16, 0.25)
    assert (r.memory_mb, r.cpu) == (16, 0.25)


@settings(deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcdef"), st.booleans(),
                          st.integers(16, 4096), st.sampled_from([0.05, 0.25, 0.5, 1.0, 2.0]))))
def test_totals_match_the_records_after_any_sequence(ops):
    r = Records()
    for key, add, mb, cpu in ops:
        if add:
            r[key] = rec(mb, cpu)
        elif key in r and mb % 2:
            del r[key]
        else:
            r.pop(key, None)
        assert r.memory_mb == sum(x.spec.memory_mb for x in r.values())
        assert abs(r.cpu - sum(x.spec.cpu for x in r.values())) < 1e-9
