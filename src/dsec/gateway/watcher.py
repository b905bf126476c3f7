"""The watcher: the latest load and health of every node, kept fresh in the background.

Placement reads this snapshot and never asks every node per request (at 160 nodes and
5,000 creations a second that would be 800,000 calls a second). Each node's load is
fetched every ``period_s``, and again at once when a request to that node fails (the
node "reports a change" by failing). A node whose last good answer is older than
``stale_after_s``, or that failed ``max_failures`` probes in a row, is unhealthy: it
gets no placements and requests for its sandboxes fail fast with :class:`NodeLost`.

Only the probes decide: a request that failed (one slow connect to a node busy with a
burst) has the node probed now, and a failed probe is repeated after ``retry_s``, but
the request itself counts for nothing. A probe that fails (refused, garbage, a wrong
token, another node's load) counts; one that is merely slow (no answer within its
``timeout_s``) does not: the node ages instead from the last time it answered anything
(a probe, or any request: the client's ``answered_at``). An overloaded node is so not a
lost one; a dead one refuses two probes within a fraction of a second, and a hung one is
silent past ``stale_after_s``, counted from its last answer, not from a probe that found
answers since the one before (that had a hung node marked seconds late).

Each node is probed on its own: a full refresh starts a probe of every node that has
none in flight and does not wait for them, so one hung node (each probe of it waits
``timeout_s``) does not slow the refresh of the others into looking stale.

Between probes, a node's answer to one of this gateway's creates carries what the node
holds (:meth:`Watcher.counted`): the other gateways' placements on it show at once, not a
period later. Several gateways placing at once otherwise each saw the others' creates
only at the next probe, and piled onto the nodes that had looked emptiest to all of them.

The rules are the pure :func:`health` and :class:`Pending`; the loop is the only I/O.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from dsec.cluster.base import Cluster
from dsec.cluster.nodeclient import NodeClient
from dsec.placement.admission import NodeLoad

__all__ = ["NodeView", "Pending", "Watcher", "health"]

log = logging.getLogger("dsec.gateway.watcher")


@dataclass(frozen=True)
class NodeView:
    """What the gateway last heard from one node."""

    node_id: str
    short: str
    load: NodeLoad | None = None
    seen_at: float | None = None  # monotonic time of the last good answer
    load_at: float | None = None  # wall-clock time (time.time) the load in it was asked for
    failures: int = 0             # refreshes failed in a row
    error: str | None = None      # why the last one failed
    in_process: bool = False      # the node lives in this process: it cannot go away
    distrusted_until: float = 0.0  # it answered what no node sends: no requests until then
    counted_at: float | None = None  # when the create went out whose answer set its counts
    probed: int | None = None     # sandboxes by the last probe itself (asked at load_at): what
    #                               the project ledger is reconciled against, whose rows are
    #                               confirmed only after a create's answer has set load


def health(view: NodeView, now: float, stale_after_s: float, max_failures: int = 2) -> bool:
    """True when the node may get placements and requests: it answered recently enough,
    has not failed ``max_failures`` times in a row since, and is not distrusted. Pure."""
    if view.seen_at is None or view.load is None:
        return False
    if view.in_process:
        return True
    if view.failures >= max_failures or now < view.distrusted_until:
        return False
    return now - view.seen_at <= stale_after_s


@dataclass
class Pending:
    """This gateway's placements a node's snapshot does not show yet.

    A placement is noted with the time it was made; a snapshot fetched after that time
    includes it, so it is forgotten then. Without this, a burst of creates between two
    refreshes would all go to the node that looked emptiest."""

    placed: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    totals: dict[str, int] = field(default_factory=dict)  # per node, kept as they change

    def add(self, node_id: str, count: int, at: float) -> None:
        self.placed.setdefault(node_id, []).append((at, count))
        self.totals[node_id] = self.totals.get(node_id, 0) + count

    def seen(self, node_id: str, snapshot_started: float) -> None:
        kept = [(t, n) for t, n in self.placed.get(node_id, []) if t >= snapshot_started]
        if kept:
            self.placed[node_id] = kept
            self.totals[node_id] = sum(n for _, n in kept)
        else:
            self.placed.pop(node_id, None)
            self.totals.pop(node_id, None)

    def counts(self) -> dict[str, int]:
        """Placements not yet seen, per node (the live mapping: read, do not change)."""
        return self.totals


def _with_counts(load: NodeLoad, counts: tuple[int, int, float]) -> NodeLoad:
    """``load`` with (sandboxes, memory_reserved_mb, cpu_reserved) from ``counts``. Pure."""
    sandboxes, memory_mb, cpu = counts
    return replace(load, sandboxes=sandboxes, memory_reserved_mb=memory_mb, cpu_reserved=cpu)


def _heard(seen_at: float | None, answered_at: float | None) -> float | None:
    """When the node was last heard from: its last good probe or, if later, its last
    answer to anything. Pure."""
    if answered_at is None or seen_at is not None and answered_at <= seen_at:
        return seen_at
    return answered_at


class Watcher:
    """Refreshes every node's view of ``cluster`` in the background."""

    def __init__(self, cluster: Cluster, period_s: float = 1.0, stale_after_s: float = 4.0,
                 timeout_s: float = 2.0, max_failures: int = 2, abort_after_s: float = 30.0,
                 retry_s: float = 0.2, distrust_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cluster = cluster
        self.distrust_s = distrust_s
        self.period_s, self.stale_after_s, self.retry_s = period_s, stale_after_s, retry_s
        self.timeout_s, self.max_failures = timeout_s, max_failures
        self.abort_after_s = abort_after_s
        self.clock = clock
        self.views: dict[str, NodeView] = {}
        self._clients: dict[str, NodeClient] = {}
        self.pending = Pending()
        self._healthy: list[NodeView] | None = None  # healthy views, until _healthy_until
        self._healthy_until = 0.0
        self._remote: list[NodeLoad] | None = None  # their loads, when none is in process
        self._remote_at: dict[str, int] = {}  # node id -> its place in _remote
        self._task: asyncio.Task | None = None
        self._wake = asyncio.Event()
        self._suspects: set[str] = set()  # to probe before the next full refresh
        self._probing: dict[str, asyncio.Task] = {}  # node id -> its probe in flight
        self._retry_at: float | None = None  # loop time of the next retry of failed probes

    # ---- reading the snapshot (no I/O) ----
    def healthy(self, node_id: str) -> bool:
        view = self.views.get(node_id)
        return view is not None and health(view, self.clock(), self.stale_after_s,
                                           self.max_failures)

    def loads(self) -> list[NodeLoad]:
        """Loads of the healthy nodes, as last seen (a node in this process: as it is now,
        since reading it costs no I/O). The healthy set is worked out once per change of
        the views, not per placement."""
        now = self.clock()
        if self._healthy is None or now > self._healthy_until:
            self._healthy = [v for v in self.views.values() if health(
                v, now, self.stale_after_s, self.max_failures)]
            self._healthy_until = min((v.seen_at + self.stale_after_s for v in self._healthy
                                       if not v.in_process), default=float("inf"))
            # remote loads change only with the views: built once per change, copied per
            # placement (160 nodes: the loop below was a few % of a create's CPU)
            self._remote = None if any(v.in_process for v in self._healthy) else [
                v.load for v in self._healthy]
            self._remote_at = {v.node_id: i for i, v in enumerate(self._healthy)}
        if self._remote is not None:
            return list(self._remote)
        out = []
        for v in self._healthy:
            live = getattr(self._clients.get(v.node_id), "load_now", None)
            out.append(live() if v.in_process and live is not None else v.load)
        return out

    def client(self, node_id: str) -> NodeClient | None:
        """The client of a node this watcher knows."""
        return self._clients.get(node_id)

    def down(self) -> list[str]:
        """Node ids that are known but unhealthy now."""
        return [k for k in self.views if not self.healthy(k)]

    def view(self, node_id: str) -> NodeView | None:
        return self.views.get(node_id)

    # ---- keeping it fresh ----
    async def start(self) -> None:
        await self.refresh()
        self._task = asyncio.create_task(self._loop(), name="dsec-watcher")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._probing.values()) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._task = None
        self._probing.clear()

    def _put(self, view: NodeView) -> None:
        self.views[view.node_id] = view
        self._healthy = None

    def report_failure(self, node_id: str, error: str) -> None:
        """A request to the node failed: probe it now, not at the next tick. The failure
        itself is no verdict (a request's connect may be slow under load); the probe is."""
        if node_id in self.views:
            self._suspects.add(node_id)
            self._wake.set()

    def distrust(self, node_id: str, why: str) -> None:
        """The node answered a request with what no dsec node sends (garbage, another
        node's sandbox, a refusal of this gateway's credential): no placements and no
        requests for ``distrust_s``, whatever its probes say meanwhile (a node may answer
        its probes well and everything else badly)."""
        view = self.views.get(node_id)
        if view is None:
            return
        if self.clock() >= view.distrusted_until:
            log.warning("node %s not trusted for %.0f s: it %s", node_id, self.distrust_s, why)
        self._put(replace(view, error=why, distrusted_until=self.clock() + self.distrust_s))
        client = self._clients.get(node_id)
        if client is not None:
            self._changed(client)

    def counted(self, node_id: str, counts: tuple[int, int, float], sent_at: float) -> None:
        """A node's answer to a create said what it holds (sandboxes, memory and CPU
        reserved): its load is taken as that at once, with the other gateways' placements
        on it, and this gateway's own placements on it made before ``sent_at`` (when the
        create went out) are forgotten, as a probe started then would. Between probes each
        gateway so sees the nodes it places on as they are, not as they were up to a
        period ago (with 4 gateways at once, that staleness piled creates onto the nodes
        that looked emptiest to all of them). Health is not touched: only probes decide."""
        view = self.views.get(node_id)
        if view is None or view.load is None or view.in_process:
            return
        load = _with_counts(view.load, counts)
        self.views[node_id] = view = replace(view, load=load, counted_at=sent_at)
        self.pending.seen(node_id, sent_at)
        if self._healthy is not None and (i := self._remote_at.get(node_id)) is not None:
            self._healthy[i] = view  # the healthy set is the same: no rebuild
            if self._remote is not None:
                self._remote[i] = load

    def _members(self) -> list[NodeClient]:
        clients = self.cluster.clients()
        for c in clients:
            if hasattr(c, "on_untrusted"):
                c.on_untrusted = self.distrust
            if hasattr(c, "on_counts"):
                c.on_counts = self.counted
        self._clients = {c.node_id: c for c in clients}
        for gone in set(self.views) - set(self._clients):
            self.views.pop(gone, None)
            self._healthy = None
        return clients

    async def refresh(self) -> None:
        """Probe every node now and wait for the answers (or their timeouts)."""
        await asyncio.gather(*(self._refresh_one(c) for c in self._members()))

    def _rechecked(self, failed: bool = True) -> list[NodeClient]:
        """The nodes a request reported and (with ``failed``) those whose last probe
        failed, not yet ``max_failures`` times: probed before the next full refresh, so a
        dead node is marked in about ``retry_s``."""
        ids = set(self._suspects)
        if failed:
            ids |= {k for k, v in self.views.items() if 0 < v.failures < self.max_failures}
        self._suspects = set()
        return [c for k in ids if (c := self._clients.get(k)) is not None]

    async def recheck(self) -> None:
        await asyncio.gather(*(self._refresh_one(c) for c in self._rechecked()))

    def _start_probes(self, clients: list[NodeClient]) -> None:
        """A probe of each of ``clients`` that has none in flight, not waited for."""
        for c in clients:
            if c.node_id not in self._probing:
                task = asyncio.create_task(self._refresh_one(c), name=f"dsec-probe-{c.short}")
                self._probing[c.node_id] = task
                task.add_done_callback(lambda t, k=c.node_id: self._probing.pop(k, None)
                                       if self._probing.get(k) is t else None)

    async def _refresh_one(self, client: NodeClient) -> None:
        await self._probe(client)
        self._changed(client)

    def _changed(self, client: NodeClient) -> None:
        """A node marked unhealthy has what is in flight to it ended (NodeLost) rather
        than left waiting as long as it hangs, except its creates; one silent for
        ``abort_after_s`` has those ended too; one that answers again is revived. Not
        the creates at the first mark: a node busy with a long request (its share of a
        big batch) looks the same for a while, and ending it would orphan what it makes."""
        if not hasattr(client, "release"):  # in this process: it cannot hang apart
            return
        if self.healthy(client.node_id):
            if client.lost:
                client.revive()
            return
        view = self.views.get(client.node_id)
        if view is None or view.seen_at is None or client.aborted:
            return
        silent = self.clock() - view.seen_at
        if silent >= self.abort_after_s:
            log.warning("node %s silent for %.0f s: ending its creates in flight",
                        client.node_id, silent)
            client.abort()
        elif not client.lost:
            log.warning("node %s marked unhealthy (%s): ending its requests in flight "
                        "but creates", client.node_id, view.error or "silent")
            client.release()

    async def _probe(self, client: NodeClient) -> None:
        started, asked_at = self.clock(), time.time()
        view = self.views.get(client.node_id) or NodeView(
            client.node_id, client.short, in_process=getattr(client, "in_process", False))
        try:
            load = await asyncio.wait_for(client.load(), self.timeout_s)
        except asyncio.TimeoutError:
            # Slow is not gone, and no verdict by itself: a node busy with its share of a
            # large batch (or a gateway whose own loop lags) looks the same for a while.
            # It ages from the last time it answered anything (answered_at, on this
            # watcher's clock), and is unhealthy once silent for stale_after_s. Its last
            # load plus this gateway's pending placements stand in meanwhile.
            seen = _heard(view.seen_at, getattr(client, "answered_at", None))
            heard = view.load is not None and seen != view.seen_at
            why = f"no load answer within {self.timeout_s:g} s"
            self._put(replace(view, seen_at=seen if heard else view.seen_at,
                              error=f"busy: {why}" if heard else f"slow: {why}"))
            return
        except Exception as exc:  # noqa: BLE001 - any failure makes the node suspect
            why = (getattr(exc, "why", None)  # NodeLost's own message repeats the rest
                   or (f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__))
            if view.failures == 0:
                log.warning("node %s did not answer: %s", client.node_id, why)
            self._put(replace(view, failures=view.failures + 1, error=why))
            if view.failures + 1 < self.max_failures:
                self._retry_soon()
            return
        if not isinstance(load, NodeLoad) or load.node_id != client.node_id:
            self._put(replace(
                view, failures=self.max_failures, error="answered with another node's load"))
            return
        if view.failures:
            log.info("node %s answers again", client.node_id)
        probed = load.sandboxes
        if view.counted_at is not None and view.counted_at > started and view.load is not None:
            # a create that went out after this probe did answered first: its counts are
            # the later ones
            load = _with_counts(load, (view.load.sandboxes, view.load.memory_reserved_mb,
                                       view.load.cpu_reserved))
        self._put(replace(view, load=load, seen_at=started, load_at=asked_at, probed=probed,
                          failures=0,
                          error=view.error if self.clock() < view.distrusted_until else None))
        self.pending.seen(client.node_id, started)

    def _retry_soon(self) -> None:
        """A probe failed (not yet max_failures times): the loop probes the node again
        ``retry_s`` from now, not a whole period later."""
        if self._task is None:
            return
        at = asyncio.get_running_loop().time() + self.retry_s
        if self._retry_at is None or at < self._retry_at:
            self._retry_at = at
            self._wake.set()  # the loop takes the new deadline into its wait

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_full = loop.time() + self.period_s
        while True:
            wait = next_full - loop.time()
            if self._retry_at is not None:
                wait = min(wait, self._retry_at - loop.time())
            try:
                await asyncio.wait_for(self._wake.wait(), max(wait, 0.0))
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            try:
                now = loop.time()
                if now >= next_full:
                    self._retry_at = None
                    self._start_probes(self._members())
                    next_full = now + self.period_s
                else:
                    due = self._retry_at is not None and now >= self._retry_at
                    if due:
                        self._retry_at = None
                    self._start_probes(self._rechecked(due))
            except Exception:  # noqa: BLE001 - the watcher must outlive any one refresh
                log.exception("watcher refresh failed")
