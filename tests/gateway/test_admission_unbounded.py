"""Admission in a project that nothing bounds takes no transaction of its own: the rows
are written with the next write (or within FLUSH_S), and everything that reads or changes
the counts writes them first. Real SQLite files, two gateways sharing one store."""

from __future__ import annotations

import pytest

from dsec.api.errors import Conflict, QuotaExceeded
from dsec.api.projects import Quota
from dsec.gateway.projects import Projects
from dsec.gateway.projects.quota import Ask


def _projects(tmp_path) -> Projects:
    p = Projects("root-token", tmp_path / "projects.db")
    p.flushes = []
    p.ledger.defer = lambda: p.flushes.append(1)  # a running loop would flush() later
    return p


def _written(p: Projects, path: str) -> int:
    """How many sandboxes of ``path`` the store holds, read as another gateway would."""
    row = p.conn.execute("SELECT sandboxes FROM usage WHERE path = ?", (path,)).fetchone()
    return row[0] if row else 0


def _commits(p: Projects) -> int:
    return p.conn.total_changes


async def test_an_unbounded_project_is_admitted_without_a_commit(tmp_path):
    p = _projects(tmp_path)
    p.store.create("free", Quota())
    before = _commits(p)
    res = await p.admission.admit("free", Ask(3, 0.5, 64), 0)
    assert len(res.keys) == 3 and res.problem is None
    assert _commits(p) == before and p.ledger.waiting and p.flushes == [1]
    assert _written(p, "free") == 0
    p.ledger.flush()  # what the loop does within FLUSH_S
    assert _written(p, "free") == 3 and _written(p, "") == 3
    assert p.store.usage("free").memory_mb == 3 * 64


async def test_a_bounded_chain_still_commits_each_group(tmp_path):
    """A quota anywhere on the chain (the parent's here) takes the transaction: another
    gateway must see the room taken before this one asks a node."""
    p = _projects(tmp_path)
    p.store.create("team", Quota(sandboxes=10))
    p.store.create("team/run", Quota())
    await p.admission.admit("team/run", Ask(2, 0.5, 64), 0)
    assert _written(p, "team") == 2 and _written(p, "team/run") == 2
    p.store.create("rated", Quota(creations_per_s=100))
    await p.admission.admit("rated", Ask(1, 0.5, 64), 0)
    assert _written(p, "rated") == 1


async def test_a_quota_set_after_deferred_grants_counts_them(tmp_path):
    """The deferred rows are written before a project changes: a quota of 3 set after 3
    deferred grants refuses the fourth (fails when set_quota does not settle first)."""
    p = _projects(tmp_path)
    p.store.create("late", Quota())
    for _ in range(3):
        await p.admission.admit("late", Ask(1, 0.5, 64), 0)
    p.store.set_quota("late", Quota(sandboxes=3))
    other = Projects("root-token", tmp_path / "projects.db")  # a second gateway
    try:
        with pytest.raises(QuotaExceeded, match="holds 3 of its quota.sandboxes 3"):
            await other.admission.admit("late", Ask(1, 0.5, 64), 0)
    finally:
        await other.stop()


async def test_usage_and_delete_see_deferred_grants(tmp_path):
    p = _projects(tmp_path)
    p.store.create("gone", Quota())
    await p.admission.admit("gone", Ask(2, 0.25, 32), 0)
    assert p.store.usage("gone").sandboxes == 2
    with pytest.raises(Conflict, match="holds 2 sandboxes"):
        p.store.delete("gone")


async def test_a_deferred_grant_confirmed_and_given_back_balances(tmp_path):
    p = _projects(tmp_path)
    p.store.create("bal", Quota())
    a = await p.admission.admit("bal", Ask(2, 0.5, 64), 0)
    p.ledger.confirm([(a.keys[0], "sb-n-1", "node-n")])
    p.admission.give_back(a.keys[1:])  # the node made only one
    assert p.store.usage("bal").sandboxes == 1 and p.ledger.held_on("node-n") == 1
    p.ledger.stopped("sb-n-1")
    assert p.store.usage("bal").sandboxes == 0 and not p.ledger.waiting


async def test_an_earlier_ticket_of_another_gateway_keeps_the_line(tmp_path):
    """Nothing bounds the project, but a create of it waits (for a node with room) on
    another gateway: a newcomer here goes behind it, not through the fast path."""
    p = _projects(tmp_path)
    p.store.create("fifo", Quota())
    other = Projects("root-token", tmp_path / "projects.db")
    try:
        other.line_ticket = other.admission.line.arrival()
        other.admission.line.enter("fifo", other.line_ticket)
        other.admission.line.beat()
        with pytest.raises(QuotaExceeded, match="on another gateway"):
            await p.admission.admit("fifo", Ask(1, 0.5, 64), 0)
        assert not p.ledger.waiting
        other.admission.line.leave(other.line_ticket)
        assert len((await p.admission.admit("fifo", Ask(1, 0.5, 64), 0)).keys) == 1
    finally:
        await other.stop()


def _rows(p: Projects) -> list[tuple]:
    return p.conn.execute("SELECT key, sb_id, node FROM held ORDER BY key").fetchall()


async def test_a_retried_create_confirmed_in_one_write_holds_one_row(tmp_path):
    """Two reservations confirmed with the same sandbox (a create retried with its
    request_id, both answered before the write): one row, counted once."""
    p = _projects(tmp_path)
    p.store.create("retry", Quota())
    a = await p.admission.admit("retry", Ask(1, 0.5, 64), 0)
    b = await p.admission.admit("retry", Ask(1, 0.5, 64), 0)
    p.ledger.confirm([(a.keys[0], "sb-r-1", "node-r")])
    p.ledger.confirm([(b.keys[0], "sb-r-1", "node-r")])
    p.ledger.flush()
    assert _rows(p) == [(a.keys[0], "sb-r-1", "node-r")]
    assert _written(p, "retry") == 1 and _written(p, "") == 1


async def test_a_retried_create_confirmed_after_a_write_drops_its_row(tmp_path):
    """The first attempt's row was written (and confirmed) before the retry's: the
    retry's reservation, written earlier too, is dropped, not counted twice."""
    p = _projects(tmp_path)
    p.store.create("later", Quota())
    a = await p.admission.admit("later", Ask(1, 0.5, 64), 0)
    b = await p.admission.admit("later", Ask(1, 0.5, 64), 0)
    p.ledger.flush()  # both reservations in the store, neither confirmed
    p.ledger.confirm([(a.keys[0], "sb-l-1", "node-l")])
    p.ledger.flush()
    p.ledger.confirm([(b.keys[0], "sb-l-1", "node-l")])
    p.ledger.flush()
    assert _rows(p) == [(a.keys[0], "sb-l-1", "node-l")]
    assert _written(p, "later") == 1


async def test_a_bounded_reservation_is_confirmed_in_place(tmp_path):
    """A bounded reservation's row is written at admission; its confirmation, kept in
    memory, updates that row (not a second one)."""
    p = _projects(tmp_path)
    p.store.create("capped", Quota(sandboxes=5))
    a = await p.admission.admit("capped", Ask(2, 0.5, 64), 0)
    p.ledger.confirm([(a.keys[0], "sb-c-1", "node-c"), (a.keys[1], "sb-c-2", "node-c")])
    p.ledger.flush()
    assert sorted(r[1] for r in _rows(p)) == ["sb-c-1", "sb-c-2"]
    assert _written(p, "capped") == 2 and p.ledger.held_on("node-c") == 2


async def test_a_large_batch_is_written_whole(tmp_path):
    """5,000 reservations and their confirmations (more than one statement's chunk) in one
    write: every row with its sandbox, the sums right, one held twice dropped."""
    p = _projects(tmp_path)
    p.store.create("big", Quota())
    a = await p.admission.admit("big", Ask(5000, 0.01, 8), 0)
    made = [(k, f"sb-b-{i}", "node-b") for i, k in enumerate(a.keys)]
    made[-1] = (a.keys[-1], "sb-b-0", "node-b")  # the last one answered with the first's
    p.ledger.confirm(made)
    p.ledger.flush()
    assert p.conn.execute("SELECT count(*), count(sb_id) FROM held").fetchone() == (4999, 4999)
    assert _written(p, "big") == 4999 and p.ledger.held_on("node-b") == 4999
    assert p.store.usage("big").memory_mb == 4999 * 8
