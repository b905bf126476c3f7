"""Queued admission is first come, first served per project: nobody who arrives later is
admitted before a create (or a batch item) of the same project that is still waiting.

Real ledger on a SQLite file, no server. Where a node would make the sandboxes, the test
stands in for it (an ``attempt`` or a ``create_batch`` that records what it was given), so
that the order asserted is the admission's own; the HTTP path is covered by
``benchmarks/bench_projects.py``'s burst.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from dsec.api.errors import Capacity
from dsec.api.models import CreateManyRequest, SandboxInfo, SandboxSpec
from dsec.api.projects import Quota
from dsec.gateway import admitted
from dsec.gateway.projects import Principal, Projects
from dsec.gateway.projects.quota import Ask

ONE = Ask(1, 0.5, 64)


def _projects(tmp_path) -> Projects:
    return Projects("root-token", tmp_path / "projects.db")


def _free(p: Projects, keys: list[str]) -> None:
    p.ledger.release(keys)
    p.admission.freed()


async def _let_others_run(steps: int = 200) -> None:
    """Loop turns, not time: whatever was woken gets to run (a wakeup takes a few)."""
    for _ in range(steps):
        await asyncio.sleep(0)


async def _until(cond, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def test_a_create_that_found_no_node_keeps_its_place_while_it_backs_off(tmp_path):
    """A is admitted, no node has room, it gives the room back and backs off: N, who
    arrives meanwhile, must not take that room."""
    p = _projects(tmp_path)
    p.store.create("c", Quota(sandboxes=1))
    granted: list[tuple[str, list[str]]] = []
    refused = asyncio.Event()

    async def attempt_a(res):
        if not refused.is_set():
            refused.set()
            raise Capacity("no node has room")
        granted.append(("A", res.keys))

    async def attempt_n(res):
        granted.append(("N", res.keys))

    a = asyncio.create_task(p.admission.hold("c", ONE, 30, attempt_a, Capacity))
    await refused.wait()  # A has given its room back and sleeps poll_s
    n = asyncio.create_task(p.admission.hold("c", ONE, 30, attempt_n, Capacity))
    await _until(lambda: granted, "the first admission")
    _free(p, granted[0][1])
    await asyncio.wait_for(asyncio.gather(a, n), 30)
    assert [who for who, _ in granted] == ["A", "N"]


async def test_a_batch_keeps_its_place_between_its_runs(tmp_path, monkeypatch):
    """Batch B (2 items) waits first, then N. One slot frees: B's first item is made;
    while its node works a second slot frees. It is B's, not N's."""
    p = _projects(tmp_path)
    p.store.create("b", Quota(sandboxes=2))
    held = [await p.admission.admit("b", ONE, 0) for _ in range(2)]
    granted: list[str] = []
    runs: list[int] = []

    async def fake_create_batch(gw, part):  # stands in for the nodes
        runs.append(part.count)
        granted.extend(["B"] * part.count)
        if len(runs) == 1:
            _free(p, held[1].keys)  # the second slot frees while this run is made
            await _let_others_run()  # N would take it now if it could
        now = time.time()
        return [SandboxInfo(id=f"sb-b-{part.first_index + i}", node="node-b",
                            backend="container", image="busybox", state="running", cpu=0.5,
                            memory_mb=64, disk_mb=1024, created_at=now, last_active_at=now)
                for i in range(part.count)], []

    monkeypatch.setattr(admitted, "create_batch", fake_create_batch)
    gw = SimpleNamespace(projects=p)
    who = Principal(who="t", project="b", role="user")
    # wait_s=10: before the fix N took B's slot and B waited this long in vain
    req = CreateManyRequest(count=2, spec=SandboxSpec(cpu=0.5, memory_mb=64, wait_s=10))
    batch = asyncio.create_task(admitted.create_many(gw, who, req))
    await _let_others_run()

    async def attempt_n(res):
        granted.append("N")
        return res

    n = asyncio.create_task(p.admission.hold("b", ONE, 30, attempt_n, Capacity))
    await _let_others_run()
    _free(p, held[0].keys)  # B's first run
    made, errors = await asyncio.wait_for(batch, 30)
    assert granted == ["B", "B"] and runs == [1, 1]
    assert errors == [] and len(made) == 2
    p.ledger.stopped(made[0].id)  # room for N only now
    p.admission.freed()
    await asyncio.wait_for(n, 30)
    assert granted == ["B", "B", "N"]


async def test_a_newcomer_as_room_comes_free_joins_behind_the_waiters(tmp_path):
    """The slot frees and, before the head's wakeup has run, a newcomer arrives."""
    p = _projects(tmp_path)
    p.store.create("f", Quota(sandboxes=1))
    first = await p.admission.admit("f", ONE, 0)
    order: list[str] = []

    async def wait(name: str):
        res = await p.admission.admit("f", ONE, 30)
        order.append(name)
        return res

    w = asyncio.create_task(wait("waiter"))
    await _let_others_run()
    _free(p, first.keys)
    late = asyncio.create_task(wait("newcomer"))  # the same loop turn as the stop
    res = await asyncio.wait_for(w, 30)
    _free(p, res.keys)
    await asyncio.wait_for(late, 30)
    assert order == ["waiter", "newcomer"]


async def test_waiters_for_the_creation_rate_are_served_in_arrival_order(tmp_path):
    p = _projects(tmp_path)
    p.store.create("r", Quota(creations_per_s=50))
    burst = await p.admission.admit("r", Ask(50, 0.5, 64), 0, partial=True)
    assert len(burst.keys) == 50  # the bucket (one second's worth) is empty now
    order: list[int] = []

    async def wait(i: int):
        await p.admission.admit("r", ONE, 30)
        order.append(i)

    tasks = []
    for i in range(8):
        tasks.append(asyncio.create_task(wait(i)))
        await asyncio.sleep(0)  # its first step joins the line: arrival order is i
    await asyncio.wait_for(asyncio.gather(*tasks), 30)
    assert order == list(range(8))


async def test_creates_asked_for_together_share_one_commit(tmp_path, monkeypatch):
    """Twenty admissions started in one loop turn: one write transaction, and each gets
    its own room (the quota of 15 holds: five are refused)."""
    p = _projects(tmp_path)
    p.store.create("g", Quota(sandboxes=15))
    groups = []
    real = p.ledger.transaction

    def counted():
        groups.append(1)
        return real()

    monkeypatch.setattr(p.ledger, "transaction", counted)
    got = await asyncio.gather(*(p.admission.admit("g", ONE, 0) for _ in range(20)),
                               return_exceptions=True)
    admitted_ = [r for r in got if not isinstance(r, BaseException)]
    assert len(groups) == 1
    assert len(admitted_) == 15 and len({k for r in admitted_ for k in r.keys}) == 15
    assert all(type(r).__name__ == "QuotaExceeded" for r in got if r not in admitted_)
    assert p.ledger.conn.execute("SELECT count(*) FROM held WHERE path = 'g'").fetchone()[0] \
        == 15


async def test_a_refused_create_that_waits_blocks_later_ones_of_its_group(tmp_path):
    """In one group, big A (does not fit, waits) comes before small B (would fit): B must
    not pass A, as it would not have one after the other."""
    p = _projects(tmp_path)
    p.store.create("h", Quota(cpu=1.0))
    order: list[str] = []

    async def one(name: str, ask: Ask):
        res = await p.admission.admit("h", ask, 30)
        order.append(name)
        return res

    a = asyncio.create_task(one("A", Ask(1, 2.0, 64)))
    b = asyncio.create_task(one("B", Ask(1, 0.5, 64)))
    await _let_others_run()
    assert order == [] and [w.ticket for w in p.admission.lines["h"]] == sorted(
        w.ticket for w in p.admission.lines["h"]) and len(p.admission.lines["h"]) == 2
    a.cancel()
    res_b = await asyncio.wait_for(b, 30)  # A gone: B is the head, and fits
    assert order == ["B"] and len(res_b.keys) == 1


async def test_a_cancelled_create_gives_its_room_back_and_leaves_no_place(tmp_path):
    """Cancelled before its group commits: what it was given goes back, and it holds no
    place in line."""
    p = _projects(tmp_path)
    p.store.create("k", Quota(sandboxes=1))
    t = asyncio.create_task(p.admission.admit("k", ONE, 30))
    await asyncio.sleep(0)  # asked for; the group commits in the next turn
    t.cancel()
    await _let_others_run()
    assert "k" not in p.admission.lines
    assert p.ledger.conn.execute("SELECT count(*) FROM held WHERE path = 'k'").fetchone()[0] \
        == 0
    res = await p.admission.admit("k", ONE, 0)
    assert len(res.keys) == 1
