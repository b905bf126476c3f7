"""The SQLite trajectory log: ordered, append-only, durable across reopen."""

import sqlite3

import pytest

from dsec.trajectory.log import TrajectoryLog


@pytest.fixture
def log(tmp_path):
    lg = TrajectoryLog(tmp_path / "trajectory.db")
    yield lg
    lg.close()


def test_entries_come_back_in_order_with_results(log):
    for i in range(3):
        log.append("sb-a-1", f"t{i}", "exec", f"fp{i}", {"cmd": f"echo {i}"}, {"exit_code": i})
    log.append("sb-b-2", "t0", "exec", "fp", {"cmd": "x"}, {"exit_code": 9})
    got = log.entries("sb-a-1")
    assert [(e.seq, e.step, e.result["exit_code"]) for e in got] == [
        (0, "t0", 0), (1, "t1", 1), (2, "t2", 2)]
    assert log.count("sb-b-2") == 1


def test_rows_cannot_be_changed_or_deleted(log):
    log.append("sb-a-1", "t0", "exec", "fp", {}, {})
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        log._db.execute("UPDATE steps SET result='{}'")
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        log._db.execute("DELETE FROM steps")


def test_a_step_key_is_unique_per_sandbox(log):
    log.append("sb-a-1", "t0", "exec", "fp", {}, {})
    with pytest.raises(sqlite3.IntegrityError):
        log.append("sb-a-1", "t0", "exec", "fp", {}, {})
    assert log.count("sb-a-1") == 1


def test_log_survives_reopen(tmp_path):
    first = TrajectoryLog(tmp_path / "t.db")
    first.append("sb-a-1", "t0", "shell_run", "fp", {"cmd": "cd /"}, {"exit_code": 0})
    first.audit("sb-a-1", "trajectory_diverged", "step 't9' ...")
    first.close()
    again = TrajectoryLog(tmp_path / "t.db")
    assert again.keyed("sb-a-1") == [("t0", 0, "fp")]
    assert [r.kind for r in again.audit_records("sb-a-1")] == ["trajectory_diverged"]
    again.close()


def test_two_writers_of_one_file_keep_one_order(tmp_path):
    # each keeps its sandboxes' next seq; the other's appends make it look again
    a, b = TrajectoryLog(tmp_path / "t.db"), TrajectoryLog(tmp_path / "t.db")
    try:
        for i in range(4):
            (a if i % 2 else b).append("sb-a-1", None, "exec", f"fp{i}", {"i": i}, {})
        assert [(e.seq, e.request["i"]) for e in a.entries("sb-a-1")] == [
            (0, 0), (1, 1), (2, 2), (3, 3)]
    finally:
        a.close()
        b.close()


def test_a_deleted_log_starts_again_at_seq_0(log):
    log.append("sb-a-1", None, "exec", "fp", {}, {})
    log.delete("sb-a-1")
    log.append("sb-a-1", None, "exec", "fp", {}, {})
    assert [e.seq for e in log.entries("sb-a-1")] == [0]


def test_the_next_seq_cache_is_bounded_and_a_forgotten_one_is_looked_up(log, monkeypatch):
    monkeypatch.setattr("dsec.trajectory.log._NEXT_KEPT", 2)
    for sb in ("sb-a-1", "sb-b-2", "sb-c-3", "sb-a-1", "sb-d-4", "sb-a-1"):
        log.append(sb, f"t{log.count(sb)}", "exec", "fp", {}, {})
    assert len(log._next) <= 2
    assert [e.seq for e in log.entries("sb-a-1")] == [0, 1, 2]
