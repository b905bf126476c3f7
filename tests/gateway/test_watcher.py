"""The watcher's rules, pure: when a node counts as healthy, and what placements it
remembers; then the loop over fake node clients (no machine needed)."""

from __future__ import annotations

import asyncio

from dsec.gateway.watcher import NodeView, Pending, Watcher, health
from dsec.placement.admission import NodeLoad


def _load(node_id: str, sandboxes: int = 0) -> NodeLoad:
    return NodeLoad(node_id=node_id, backends=("container",), cpus=2, memory_mb=4096,
                    sandboxes=sandboxes, memory_reserved_mb=0, cpu_reserved=0.0)


def test_a_node_never_heard_from_is_not_healthy():
    assert not health(NodeView("node-a", "a"), now=10.0, stale_after_s=4.0)


def test_a_view_ages_into_unhealthy():
    v = NodeView("node-a", "a", _load("node-a"), seen_at=100.0)
    assert health(v, 103.9, 4.0)
    assert not health(v, 104.1, 4.0)


def test_failures_in_a_row_make_a_fresh_view_unhealthy():
    v = NodeView("node-a", "a", _load("node-a"), seen_at=100.0, failures=1)
    assert health(v, 100.5, 4.0, max_failures=2)
    assert not health(NodeView("node-a", "a", _load("node-a"), 100.0, failures=2), 100.5, 4.0)


def test_a_node_in_this_process_stays_healthy_however_old_its_view():
    v = NodeView("node-a", "a", _load("node-a"), seen_at=0.0, failures=5, in_process=True)
    assert health(v, 1e9, 4.0)


def test_pending_placements_are_forgotten_once_a_later_snapshot_shows_them():
    p = Pending()
    p.add("node-a", 3, at=10.0)
    p.add("node-a", 2, at=12.0)
    p.add("node-b", 1, at=11.0)
    assert p.counts() == {"node-a": 5, "node-b": 1}
    p.seen("node-a", snapshot_started=11.0)  # took the first, not the second
    assert p.counts() == {"node-a": 2, "node-b": 1}
    p.seen("node-b", snapshot_started=20.0)
    assert p.counts() == {"node-a": 2}


class FakeNode:
    in_process = False

    def __init__(self, node_id: str) -> None:
        self.node_id, self.short = node_id, node_id.removeprefix("node-")
        self.up, self.calls, self.sandboxes = True, 0, 0
        self.on_counts = None

    async def load(self) -> NodeLoad:
        self.calls += 1
        if not self.up:
            raise ConnectionRefusedError("down")
        return _load(self.node_id, self.sandboxes)


class FakeCluster:
    def __init__(self, nodes) -> None:
        self.nodes = nodes

    def clients(self):
        return self.nodes


class Clock:
    t = 1000.0

    def __call__(self) -> float:
        return self.t


async def test_refresh_marks_a_dead_node_and_a_returning_one():
    a, b = FakeNode("node-a"), FakeNode("node-b")
    clock = Clock()
    w = Watcher(FakeCluster([a, b]), stale_after_s=4.0, clock=clock)
    await w.refresh()
    assert w.healthy("node-a") and w.healthy("node-b")
    b.up = False
    await w.refresh()
    assert w.healthy("node-b")  # one miss is not yet a verdict
    await w.refresh()
    assert not w.healthy("node-b") and "ConnectionRefusedError" in w.view("node-b").error
    assert [n.node_id for n in w.loads()] == ["node-a"]
    assert w.down() == ["node-b"]
    b.up = True
    await w.refresh()
    assert w.healthy("node-b")


async def test_a_silent_node_goes_unhealthy_by_age_alone():
    a = FakeNode("node-a")
    clock = Clock()
    w = Watcher(FakeCluster([a]), stale_after_s=4.0, clock=clock)
    await w.refresh()
    clock.t += 5.0  # no refresh came through meanwhile (e.g. every call hung)
    assert not w.healthy("node-a")


async def test_a_node_answering_with_another_nodes_load_is_not_trusted():
    a = FakeNode("node-a")

    async def wrong() -> NodeLoad:
        return _load("node-z")
    a.load = wrong
    w = Watcher(FakeCluster([a]))
    await w.refresh()
    assert not w.healthy("node-a")


async def test_the_loop_refreshes_in_the_background_and_on_a_reported_failure():
    a = FakeNode("node-a")
    w = Watcher(FakeCluster([a]), period_s=60.0)
    await w.start()
    try:
        first = a.calls
        w.report_failure("node-a", "connection refused")
        for _ in range(100):
            if a.calls > first:
                break
            await asyncio.sleep(0.01)
        assert a.calls > first  # woken at once, not after the 60 s period
    finally:
        await w.stop()


async def test_a_probe_that_times_out_while_the_node_answers_others_is_busy_not_gone():
    """A slow probe is no failure: the node that answers other requests stays healthy;
    the one that answers nothing at all ages out after stale_after_s."""
    a, b = FakeNode("node-a"), FakeNode("node-b")
    clock = Clock()
    w = Watcher(FakeCluster([a, b]), timeout_s=0.05, stale_after_s=4.0, clock=clock)
    await w.refresh()

    async def busy() -> NodeLoad:
        a.answered_at = clock.t  # another request to it came back while this probe waited
        await asyncio.sleep(1)

    async def hung() -> NodeLoad:
        await asyncio.sleep(1)
    a.load, b.load = busy, hung
    await w.refresh()
    assert w.healthy("node-b") and w.view("node-b").failures == 0  # slow once: no verdict
    for _ in range(3):
        clock.t += 2.0
        await w.refresh()
    assert w.healthy("node-a") and w.view("node-a").error.startswith("busy")
    assert not w.healthy("node-b") and w.view("node-b").error.startswith("slow")


async def test_a_hung_node_ages_from_its_last_answer_not_from_the_probe_that_saw_it():
    """Requests answered just before the node hung: it is marked stale_after_s after that
    last answer. (The old rule took a probe that found answers since the previous probe
    as hearing the node at the probe's end: marked seconds late, 6.8 s in bench_cluster.)"""
    a = FakeNode("node-a")
    a.answered_at = None
    clock = Clock()
    w = Watcher(FakeCluster([a]), timeout_s=0.05, stale_after_s=4.0, clock=clock)
    await w.refresh()  # a good probe at t0
    clock.t += 0.9
    a.answered_at = clock.t  # an exec answered at t0 + 0.9, then the node hangs

    async def hung() -> NodeLoad:
        await asyncio.sleep(1)
    a.load = hung
    clock.t += 1.0
    await w.refresh()  # times out: heard at t0 + 0.9, not now
    assert w.view("node-a").seen_at == 1000.9 and w.healthy("node-a")
    clock.t = 1000.9 + 4.0 + 0.01
    await w.refresh()
    assert not w.healthy("node-a")


async def test_one_hung_node_does_not_hold_up_the_probes_of_the_others():
    """The loop starts each node's probe on its own: while every probe of a hung node
    waits its timeout, the others are probed every period."""
    a, b = FakeNode("node-a"), FakeNode("node-b")
    w = Watcher(FakeCluster([a, b]), period_s=0.02, timeout_s=5.0)
    await w.refresh()

    async def hung() -> NodeLoad:
        await asyncio.sleep(60)
    b.load = hung
    await w.start()
    try:
        first = a.calls
        await asyncio.sleep(0.5)
        assert a.calls - first >= 5  # every ~period_s, not once per 5 s timeout of b
    finally:
        await w.stop()
    assert not w._probing  # stop ends the probes in flight


async def test_a_node_that_falls_is_released_then_aborted_once_and_revived():
    """Marked unhealthy: what is in flight to it ends, but creates (release); silent for
    abort_after_s: creates too (abort); each once; revived when it answers again."""
    a = FakeNode("node-a")
    a.releases = a.aborts = a.revives = 0
    a.lost = a.aborted = False

    def release():
        a.releases, a.lost = a.releases + 1, True

    def abort():
        a.aborts, a.lost, a.aborted = a.aborts + 1, True, True

    def revive():
        a.revives, a.lost, a.aborted = a.revives + 1, False, False
    a.release, a.abort, a.revive = release, abort, revive
    clock = Clock()
    w = Watcher(FakeCluster([a]), abort_after_s=30.0, clock=clock)
    await w.refresh()
    assert (a.releases, a.aborts) == (0, 0)  # healthy: nothing ended
    a.up = False
    for _ in range(4):  # marked, but not silent long enough to end its creates
        clock.t += 5.0
        await w.refresh()
    assert not w.healthy("node-a") and (a.releases, a.aborts, a.revives) == (1, 0, 0)
    for _ in range(4):
        clock.t += 5.0
        await w.refresh()
    assert (a.releases, a.aborts, a.revives) == (1, 1, 0)
    a.up = True
    await w.refresh()
    assert (a.releases, a.aborts, a.revives) == (1, 1, 1)


async def _poll(cond, limit_s: float = 20.0) -> bool:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    while not cond():
        if loop.time() - t0 > limit_s:
            return False
        await asyncio.sleep(0.01)
    return True


async def test_failed_requests_alone_never_mark_a_node_that_answers_its_probes():
    """A node under load: requests to it time out on their connect, its probes answer."""
    a = FakeNode("node-a")
    w = Watcher(FakeCluster([a]), period_s=60.0)
    await w.start()
    try:
        for _ in range(3):
            first = a.calls
            for _ in range(w.max_failures + 1):  # several requests in flight failed at once
                w.report_failure("node-a", "ConnectTimeout")
            assert w.healthy("node-a")  # none of them is a verdict...
            assert await _poll(lambda: a.calls > first)  # ...the probe, sent at once, is
            assert w.healthy("node-a") and w.view("node-a").failures == 0
    finally:
        await w.stop()


async def test_a_dead_node_a_request_reported_is_marked_by_probes_retried_soon():
    """Two probes in a row must fail; the second comes retry_s after the first, not a
    whole period later."""
    a = FakeNode("node-a")
    w = Watcher(FakeCluster([a]), period_s=3600.0, retry_s=0.05)
    await w.start()
    try:
        a.up = False
        w.report_failure("node-a", "ConnectError")
        assert await _poll(lambda: not w.healthy("node-a"))
        assert w.view("node-a").failures == w.max_failures
        a.up = True
        w.report_failure("node-a", "ConnectError")  # a request tried it again
        assert await _poll(lambda: w.healthy("node-a"))
    finally:
        await w.stop()


async def test_a_create_answers_counts_are_the_nodes_load_until_a_later_probe():
    """A node's answer to a create says what it holds; the watcher takes it as the node's
    load at once (the other gateways' placements on it included), forgets this gateway's
    placements made before the create went out, and leaves health to the probes."""
    a, b = FakeNode("node-a"), FakeNode("node-b")
    clock = Clock()
    w = Watcher(FakeCluster([a, b]), stale_after_s=4.0, clock=clock)
    await w.refresh()
    assert a.on_counts == w.counted  # the watcher hands its clients the hook
    w.pending.add("node-a", 1, at=1000.5)   # placed before the create below went out...
    w.pending.add("node-a", 2, at=1001.5)   # ...and after it
    w.counted("node-a", (40, 2048, 3.5), sent_at=1001.0)
    got = {n.node_id: n for n in w.loads()}
    assert (got["node-a"].sandboxes, got["node-a"].memory_reserved_mb,
            got["node-a"].cpu_reserved) == (40, 2048, 3.5)
    assert got["node-b"].sandboxes == 0 and w.pending.counts() == {"node-a": 2}
    clock.t += 5.0  # counts are no answer to a probe: the node still ages out
    assert not w.healthy("node-a")
    clock.t -= 5.0
    a.sandboxes = 7  # a probe that went out before the create answered later...
    clock.t = 1000.8
    await w.refresh()
    assert w.view("node-a").load.sandboxes == 40  # ...does not undo its fresher counts
    assert w.view("node-a").probed == 7  # (what the probe itself said is kept apart)
    clock.t = 1002.0
    await w.refresh()  # a probe sent after it does
    assert {n.node_id: n.sandboxes for n in w.loads()}["node-a"] == 7


async def test_counts_of_a_node_not_known_or_not_heard_yet_are_ignored():
    w = Watcher(FakeCluster([FakeNode("node-a")]))
    w.counted("node-z", (1, 1, 1.0), sent_at=0.0)
    w.counted("node-a", (1, 1, 1.0), sent_at=0.0)  # never probed: no load to update
    assert w.views == {}
