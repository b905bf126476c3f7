"""Replay matching as pure functions: live, fast-forward, or divergence."""

import pytest

from dsec.api.errors import TrajectoryDiverged
from dsec.trajectory.replay import KeyIndex, decide, fingerprint


def _index(*steps: str) -> KeyIndex:
    return KeyIndex.of([(s, i, fingerprint("exec", {"cmd": s})) for i, s in enumerate(steps)])


def _fp(cmd: str) -> str:
    return fingerprint("exec", {"cmd": cmd})


def test_new_key_on_an_empty_log_runs_live():
    assert decide(KeyIndex(), "t0", _fp("t0")).action == "live"


def test_logged_key_is_answered_from_its_entry():
    d = decide(_index("t0", "t1", "t2"), "t1", _fp("t1"))
    assert (d.action, d.seq, d.cursor) == ("replay", 1, 2)


def test_replay_of_the_last_entry_returns_to_live():
    assert decide(_index("t0", "t1"), "t1", _fp("t1")).cursor is None


def test_replay_must_follow_the_log_order():
    idx = _index("t0", "t1", "t2")
    idx.cursor = 1
    with pytest.raises(TrajectoryDiverged, match="expects step 't1'"):
        decide(idx, "t2", _fp("t2"))


def test_unknown_key_during_a_replay_diverges():
    idx = _index("t0", "t1")
    idx.cursor = 1
    with pytest.raises(TrajectoryDiverged, match="not in the log"):
        decide(idx, "other", _fp("other"))


def test_same_key_with_another_request_diverges():
    with pytest.raises(TrajectoryDiverged, match="different request"):
        decide(_index("t0"), "t0", _fp("rm -rf /"))


def test_unkeyed_call_is_live_and_ends_the_replay():
    idx = _index("t0", "t1")
    idx.cursor = 1
    assert decide(idx, None, _fp("x")) == decide(KeyIndex(), None, _fp("x"))
    assert decide(idx, None, _fp("x")).cursor is None


def test_fingerprint_ignores_timeouts_and_caps():
    a = {"cmd": "ls", "cwd": None, "env": {}, "user": None, "stdin": None,
         "background": False, "timeout": 5, "max_output": 10}
    b = dict(a, timeout=60, max_output=1 << 20)
    assert fingerprint("exec", a) == fingerprint("exec", b)
    assert fingerprint("exec", a) != fingerprint("exec", dict(a, cwd="/tmp"))


def test_a_step_sequence_restarts_with_the_same_keys():
    from dsec.trajectory import StepSequence
    first, again = StepSequence("ep3/"), StepSequence("ep3/")
    assert [first.next() for _ in range(3)] == ["ep3/0", "ep3/1", "ep3/2"]
    assert again.next() == "ep3/0"
