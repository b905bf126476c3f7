"""Retention of the trajectory log: by grace after stop, by age, by size; never a running
sandbox's log; deleted space goes back to the disk."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import pytest

from dsec.api.models import ExecRequest, SandboxSpec
from dsec.node.config import NodeConfig
from dsec.trajectory.log import TrajectoryLog
from dsec.trajectory.retention import LogSummary, TrajectoryRetention, plan_prune
from tests.support.fakenode import fake_node

NONE = TrajectoryRetention(stopped_grace_s=None, max_age_s=None, max_mb=None)
NOW = 1_000_000.0
OUTPUT = "x" * 4000  # one exec's output


def _fill(log: TrajectoryLog, n: int, entries: int = 5, start: float = NOW - 1000) -> list[str]:
    """``n`` sandboxes, each stopped one second after the previous, oldest first."""
    ids = [f"sb-test-{i:05d}" for i in range(n)]
    for i, sb in enumerate(ids):
        for k in range(entries):
            log.append(sb, f"t{k}", "exec", "fp", {"cmd": f"step {k}"},
                       {"exit_code": 0, "stdout": OUTPUT})
        log.ended(sb, at=start + i)
    log.reclaim()  # the WAL back in the file and cut back, as the node's checkpointer
    return ids


@pytest.fixture
def log(tmp_path):
    lg = TrajectoryLog(tmp_path / "trajectory.db")
    yield lg
    lg.close()


# ---- the plan (pure) ----
def test_plan_grace_counts_from_the_stop():
    logs = [LogSummary("a", last_at=NOW - 50, ended_at=NOW - 40, bytes=1),
            LogSummary("b", last_at=NOW - 50, ended_at=NOW - 5, bytes=1),
            LogSummary("c", last_at=NOW - 50, ended_at=None, bytes=1)]  # stop not seen
    policy = NONE.model_copy(update={"stopped_grace_s": 30})
    assert plan_prune(logs, set(), NOW, policy, used_bytes=3) == ["a"]


def test_plan_age_counts_from_the_newest_entry_and_spares_the_running():
    logs = [LogSummary("old", last_at=NOW - 100, ended_at=None, bytes=1),
            LogSummary("old-running", last_at=NOW - 100, ended_at=None, bytes=1),
            LogSummary("new", last_at=NOW - 1, ended_at=None, bytes=1)]
    policy = NONE.model_copy(update={"max_age_s": 60})
    assert plan_prune(logs, {"old-running"}, NOW, policy, used_bytes=3) == ["old"]


def test_plan_size_takes_the_oldest_stops_first_and_never_a_running_one():
    mib = 1 << 20
    logs = [LogSummary(f"s{i}", last_at=NOW, ended_at=NOW - 100 + i, bytes=mib)
            for i in range(10)]
    policy = NONE.model_copy(update={"max_mb": 4})
    assert plan_prune(logs, {"s0"}, NOW, policy, used_bytes=10 * mib) == [
        "s1", "s2", "s3", "s4", "s5", "s6"]
    everything_runs = {s.sandbox for s in logs}
    assert plan_prune(logs, everything_runs, NOW, policy, used_bytes=10 * mib) == []


# ---- the log file ----
def test_grace_prunes_stopped_sandboxes_after_the_period(log):
    ids = _fill(log, 40)
    policy = NONE.model_copy(update={"stopped_grace_s": 990.5})  # ids 0..9 stopped > 990.5 s ago
    report = log.prune(policy, is_live=lambda sb: False, now=NOW)
    assert report.pruned == ids[:10]
    assert log.count(ids[9]) == 0 and log.count(ids[10]) == 5


def test_age_prunes_by_the_newest_entry_even_without_a_seen_stop(log):
    unseen, running = "sb-test-crashed", "sb-test-running"  # no ended(): a node crash
    for sb in (unseen, running):
        log.append(sb, None, "exec", "fp", {}, {"exit_code": 0})
    policy = NONE.model_copy(update={"max_age_s": 3600})
    assert log.prune(policy, lambda sb: sb == running, now=time.time() + 1800).pruned == []
    report = log.prune(policy, lambda sb: sb == running, now=time.time() + 7200)
    assert report.pruned == [unseen]
    assert log.count(unseen) == 0 and log.count(running) == 1


def test_size_prunes_oldest_stopped_first_and_the_running_log_survives(log):
    ids = _fill(log, 200)
    running = ids[0]  # the oldest entries of all, and still running
    before = log.file_bytes()
    policy = NONE.model_copy(update={"max_mb": before / 4 / (1 << 20)})
    report = log.prune(policy, is_live=lambda sb: sb == running, now=NOW)
    assert running not in report.pruned and log.count(running) == 5
    assert report.pruned == ids[1:len(report.pruned) + 1]  # oldest stop first
    assert log.count(ids[-1]) == 5
    assert report.bytes_after <= before / 4 * 1.1, (before, report.bytes_after)


def test_pruning_shrinks_the_file(log, tmp_path):
    ids = _fill(log, 300)
    before = log.file_bytes()
    report = log.prune(NONE.model_copy(update={"stopped_grace_s": 0}), lambda sb: sb == ids[-1],
                       now=NOW)
    assert len(report.pruned) == 299
    assert report.bytes_before == before and report.bytes_after < before / 20, report
    assert log.file_bytes() == report.bytes_after
    assert [e.seq for e in log.entries(ids[-1])] == [0, 1, 2, 3, 4]


def test_a_log_from_before_retention_is_summarised_and_vacuumed(tmp_path):
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)  # the schema as it was: no logs table, no auto_vacuum
    db.executescript("""
        CREATE TABLE steps (sandbox TEXT NOT NULL, seq INTEGER NOT NULL, step TEXT,
            kind TEXT NOT NULL, fingerprint TEXT NOT NULL, request TEXT NOT NULL,
            result TEXT NOT NULL, at REAL NOT NULL, PRIMARY KEY (sandbox, seq)) WITHOUT ROWID;
        CREATE TABLE audit (sandbox TEXT NOT NULL, at REAL NOT NULL, kind TEXT NOT NULL,
            detail TEXT NOT NULL, count INTEGER NOT NULL DEFAULT 1);""")
    db.executemany("INSERT INTO steps VALUES (?,?,?,?,?,?,?,?)",
                   [(f"sb-old-{i}", 0, None, "exec", "fp", "{}", OUTPUT * 5, NOW - 10 * i)
                    for i in range(100)])
    db.commit()
    db.close()
    log = TrajectoryLog(path)
    try:
        assert len(log.summaries()) == 100
        before = log.file_bytes()
        report = log.prune(NONE.model_copy(update={"max_age_s": 500}), lambda sb: False,
                           now=NOW)
        assert len(report.pruned) == 50
        assert report.bytes_after < before * 0.6, (before, report.bytes_after)
    finally:
        log.close()


def test_deleting_rows_by_hand_is_still_refused(log):
    _fill(log, 1)
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        log._db.execute("DELETE FROM steps")


# ---- the node ----
@pytest.fixture
async def node(tmp_path: Path):
    svc = fake_node(tmp_path, "node-fa4e0002")
    yield svc
    await svc.close(stop_sandboxes=True)


async def test_the_node_prunes_stopped_sandboxes_in_the_background(node):
    stopped = await node.create(SandboxSpec())
    running = await node.create(SandboxSpec())
    for sb in (stopped, running):
        await node.exec(sb.id, ExecRequest(cmd="echo hi", step="s0"))
    await node.stop(stopped.id)
    [ended] = [s for s in node.trajectory.log.summaries() if s.sandbox == stopped.id]
    assert ended.ended_at is not None
    node.trajectory.start_pruning(
        TrajectoryRetention(stopped_grace_s=0, max_age_s=0, max_mb=0, interval_s=0.05),
        node.records.__contains__)
    for _ in range(100):
        if node.trajectory.log.count(stopped.id) == 0:
            break
        await asyncio.sleep(0.05)
    assert node.trajectory.log.count(stopped.id) == 0
    assert node.trajectory.log.count(running.id) == 1  # every rule would take it, but it runs


def test_server_flags_reach_the_node_config():
    from dsec.gateway.server import trajectory_options
    assert trajectory_options(None, None) == {}
    opts = trajectory_options(30.0, 512.0)
    policy = NodeConfig(trajectory=TrajectoryRetention(**opts)).trajectory
    assert (policy.stopped_grace_s, policy.max_mb, policy.max_age_s) == (30.0, 512.0, 7 * 86400)
