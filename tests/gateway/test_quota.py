"""Quota arithmetic, the ledger on a real SQLite file, and queued admission; no server."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import pytest

from dsec.api.errors import QuotaExceeded
from dsec.api.projects import Quota, Usage, ancestors, check_project_path, within
from dsec.gateway.projects import Projects
from dsec.gateway.projects.ledger import CHUNK
from dsec.gateway.projects.quota import Ask, admit_problem, grant_problem, refill


def test_paths():
    assert ancestors("a/b") == ["", "a", "a/b"] and ancestors("") == [""]
    assert within("a/b", "a") and within("a", "") and not within("ab", "a")
    for bad in ("a/../b", "a//b", "a/", ".", "-x", "/".join("x" * 17)):
        with pytest.raises(ValueError):
            check_project_path(bad)


def test_grants_come_out_of_what_the_parent_has_left():
    parent = Quota(sandboxes=10, cpu=1.0)
    assert grant_problem("p/c", "p", parent, [Quota(sandboxes=6)], Quota(sandboxes=4)) is None
    why = grant_problem("p/c", "p", parent, [Quota(sandboxes=6)], Quota(sandboxes=5))
    assert "at most 4" in why
    # float sums: 0.1 + 0.2 + 0.7 fill a core exactly
    assert grant_problem("p/c", "p", parent, [Quota(cpu=0.1), Quota(cpu=0.2)],
                         Quota(cpu=0.7)) is None
    assert grant_problem("p/c", "p", Quota(), [], Quota(sandboxes=10**9)) is None


def test_admission_checks_every_level():
    chain = [("", Quota(), Usage(sandboxes=99)), ("p", Quota(sandboxes=5), Usage(sandboxes=4)),
             ("p/c", Quota(), Usage(sandboxes=1))]
    assert admit_problem(chain, Ask(1, 1.0, 64)) is None
    assert "'p' holds 4 of its quota.sandboxes 5" in admit_problem(chain, Ask(2, 1.0, 64))


def test_bucket_refills_up_to_one_second():
    assert refill(None, None, 5.0, 100.0) == 5.0
    assert refill(0.0, 100.0, 5.0, 100.5) == 2.5
    assert refill(0.0, 100.0, 0.5, 110.0) == 1.0  # a slow rate still allows one


def _projects(tmp_path) -> Projects:
    return Projects("root-token", tmp_path / "projects.db")


def test_two_gateways_sharing_the_store_never_exceed_a_quota(tmp_path):
    first = _projects(tmp_path)
    first.store.create("p", Quota(sandboxes=50))
    gateways = [first, _projects(tmp_path)]
    got: list[int] = []

    def take(p: Projects) -> None:
        for _ in range(60):
            res = p.ledger.reserve("p", p.store.quotas(["", "p"]), Ask(1, 0.1, 16))
            got.append(len(res.keys))

    threads = [threading.Thread(target=take, args=(g,)) for g in gateways]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(got) == 50
    assert first.store.usage("p").sandboxes == 50 and first.store.usage("").sandboxes == 50


def test_reconcile_drops_what_ended_and_adopts_what_it_did_not_know(tmp_path):
    p = _projects(tmp_path)
    res = p.ledger.reserve("", {}, Ask(2, 1.0, 64))
    p.ledger.confirm([(res.keys[0], "sb-a-1", "node-a"), (res.keys[1], "sb-a-2", "node-a")])
    old = 0.0  # created long ago: adopted
    dropped, adopted = p.ledger.reconcile("node-a", {"sb-a-1": ("", 1.0, 64, 0.0),
                                                     "sb-a-3": ("x", 0.5, 32, old)}, 1e10)
    assert (dropped, adopted) == (1, 1)
    assert p.store.usage("").sandboxes == 2 and p.store.usage("x").memory_mb == 32


def test_rows_held_on_a_node_before_a_time(tmp_path):
    """What reconcile compares with a node's load: the rows confirmed before it was asked."""
    p = _projects(tmp_path)
    res = p.ledger.reserve("", {}, Ask(1, 0.1, 16))
    p.ledger.confirm([(res.keys[0], "sb-a-1", "node-a")])
    between = time.time()
    time.sleep(0.01)
    res = p.ledger.reserve("", {}, Ask(1, 0.1, 16))
    p.ledger.confirm([(res.keys[0], "sb-a-2", "node-a")])
    assert p.ledger.held_on("node-a", between) == 1 and p.ledger.held_on("node-a") == 2


async def test_waiters_are_served_in_arrival_order(tmp_path):
    p = _projects(tmp_path)
    p.store.create("q", Quota(sandboxes=1))
    first = await p.admission.admit("q", Ask(1, 1.0, 64), 0)
    order: list[int] = []

    async def wait(i: int):
        res = await p.admission.admit("q", Ask(1, 1.0, 64), 30)
        order.append(i)
        await asyncio.sleep(0.01)
        p.ledger.release(res.keys)
        p.admission.freed()

    tasks = []
    for i in range(5):
        tasks.append(asyncio.create_task(wait(i)))
        await asyncio.sleep(0.01)  # arrive one after the other
    with pytest.raises(QuotaExceeded, match="waiting behind"):  # no overtaking with 0
        await p.admission.admit("q", Ask(1, 1.0, 64), 0)
    p.ledger.release(first.keys)
    p.admission.freed()
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3, 4]


async def test_a_wait_ends_with_quota_exceeded(tmp_path):
    p = _projects(tmp_path)
    p.store.create("r", Quota(sandboxes=0, creations_per_s=1))
    with pytest.raises(QuotaExceeded, match="after waiting 0.3s") as info:
        await p.admission.admit("r", Ask(1, 1.0, 64), 0.3)
    assert info.value.retry_after_s >= 1


def test_a_revocation_or_quota_change_on_one_gateway_reaches_the_others_cache(tmp_path):
    """Callers and quotas are kept in memory between requests; a change made through
    another gateway sharing the store is seen on the next request all the same."""
    from dsec.api.errors import Unauthorized
    first, second = _projects(tmp_path), _projects(tmp_path)
    first.store.create("c", Quota(sandboxes=5))
    made = first.store.create_token("c", "user", None)
    header = f"Bearer {made.token}".encode()
    assert second.authenticate(header).project == "c"  # now kept by the second
    assert second.store.quotas(["", "c"])["c"].sandboxes == 5
    first.store.set_quota("c", Quota(sandboxes=7))
    assert second.store.quotas(["", "c"])["c"].sandboxes == 7
    first.store.revoke_token(made.id)
    with pytest.raises(Unauthorized, match="revoked"):
        second.authenticate(header)
    short = first.store.create_token("c", "user", 0.3)
    who = second.authenticate(f"Bearer {short.token}".encode())
    assert second.still_valid(who)
    import time
    deadline = time.monotonic() + 30
    while second.still_valid(who) and time.monotonic() < deadline:  # expiry: by the clock
        time.sleep(0.05)
    with pytest.raises(Unauthorized, match="expired"):
        second.authenticate(f"Bearer {short.token}".encode())


def test_deferred_confirmations_count_as_held_and_are_written_with_the_next_write(tmp_path):
    first, second = _projects(tmp_path), _projects(tmp_path)
    first.store.create("d", Quota(sandboxes=2))
    flushes: list[int] = []
    first.ledger.defer = lambda: flushes.append(1)  # a loop would flush() later
    a = first.ledger.reserve("d", first.store.quotas(["", "d"]), Ask(1, 0.1, 16))
    first.ledger.confirm([(a.keys[0], "sb-n-1", "node-n")])
    assert flushes == [1]
    # not written yet, but counted: the other gateway fits one more and no more
    assert second.conn.execute("SELECT sb_id FROM held WHERE key = ?",
                               (a.keys[0],)).fetchone() == (None,)
    assert len(second.ledger.reserve("d", second.store.quotas(["", "d"]),
                                     Ask(1, 0.1, 16)).keys) == 1
    assert second.ledger.reserve("d", second.store.quotas(["", "d"]),
                                 Ask(1, 0.1, 16)).problem is not None
    first.ledger.stopped("sb-n-1")  # its write carries the confirmation first
    assert first.store.usage("d").sandboxes == 1
    assert second.ledger.held_on("node-n") == 0


async def test_a_held_create_says_the_wait_it_asked_for(tmp_path):
    p = _projects(tmp_path)
    p.store.create("h", Quota(sandboxes=0))

    async def attempt(res):
        raise AssertionError("never admitted")
    with pytest.raises(QuotaExceeded, match=r"after waiting 0\.5s;"):
        await p.admission.hold("h", Ask(1, 1.0, 64), 0.5, attempt, RuntimeError)


def _held(p: Projects, node: str, n: int) -> list[str]:
    """``n`` sandboxes confirmed on ``node`` (ids sb-0...), project x; their keys."""
    keys: list[str] = []
    while len(keys) < n:
        keys += p.ledger.reserve("x", {}, Ask(min(500, n - len(keys)), 0.5, 32),
                                 partial=True).keys
    p.ledger.confirm([(k, f"sb-{i}", node) for i, k in enumerate(keys)])
    return keys


class _OneNode:
    """The little of a gateway that Projects.reconcile reads: one healthy node whose load
    says it has ``listed`` sandboxes, and which lists them."""

    def __init__(self, listed: list[str]) -> None:
        info = lambda sb: SimpleNamespace(id=sb, project="x", cpu=0.5, memory_mb=32,  # noqa: E731
                                          created_at=time.time())
        client = SimpleNamespace(node_id="node-a")

        async def list_():
            return [info(sb) for sb in listed]

        client.list = list_
        view = SimpleNamespace(load=SimpleNamespace(sandboxes=len(listed)),
                               probed=len(listed), load_at=time.time() + 1)
        self.cluster = SimpleNamespace(clients=lambda: [client])
        self.watcher = SimpleNamespace(view=lambda node: view, healthy=lambda node: True)


async def test_reconcile_of_thousands_gone_lets_the_loop_serve_between_chunks(tmp_path):
    """A node whose thousands of sandboxes ended (a 32,000 job stopped) is reconciled a
    chunk per transaction, with the loop free in between (all in one go held every
    request of the gateway for half a second); the sums come out right."""
    p = _projects(tmp_path)
    _held(p, "node-a", 3 * CHUNK + 7)
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    before = ticks
    await p.reconcile(_OneNode(listed=["sb-1", "sb-2"]))
    during = ticks - before
    task.cancel()
    assert during >= 3  # one turn of the loop per chunk at least
    assert p.store.usage("x").sandboxes == 2 and p.store.usage("").sandboxes == 2
    assert p.store.usage("x").memory_mb == 64


def test_a_row_stopped_between_the_listing_and_its_drop_is_given_back_once(tmp_path):
    p = _projects(tmp_path)
    _held(p, "node-a", 3)
    gone = p.ledger.gone("node-a", {}, time.time() + 1)
    p.ledger.stopped("sb-0")  # stopped through the gateway meanwhile
    assert p.ledger.drop_gone(gone) == 2
    assert p.store.usage("x") == Usage(sandboxes=0, cpu=0.0, memory_mb=0)


def test_a_release_of_more_keys_than_one_statement_takes(tmp_path):
    p = _projects(tmp_path)
    keys = p.ledger.reserve("x", {}, Ask(40_000, 0.001, 1)).keys
    p.ledger.release(keys)
    assert p.store.usage("").sandboxes == 0


async def test_a_node_with_sandboxes_too_young_to_adopt_is_not_listed_again_until_due(tmp_path):
    """Sandboxes no row knows (made straight on the node) are adopted ADOPT_AFTER_S after
    they were made; until then a difference as large or larger (more of them: another
    gateway creating) lists the node no more (it was listed every round, each listing ms
    of the node's and the gateway's time). A smaller one (something ended) lists it at
    once."""
    p = _projects(tmp_path)
    node = _OneNode(listed=["sb-y1", "sb-y2"])
    calls = 0
    client = node.cluster.clients()[0]
    inner = client.list

    async def counted():
        nonlocal calls
        calls += 1
        return await inner()
    client.list = counted
    await p.reconcile(node)
    await p.reconcile(node)
    assert calls == 1 and p.store.usage("x").sandboxes == 0  # too young: not adopted yet
    node.watcher.view("node-a").probed = 3  # one more appeared
    await p.reconcile(node)
    assert calls == 1
    node.watcher.view("node-a").probed = 1  # some ended
    await p.reconcile(node)
    assert calls == 2
