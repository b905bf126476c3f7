"""Queued admission: a create that does not fit waits, first come first served per project,
across every gateway sharing the control store.

Every create takes a ticket when it reaches the gateway: its arrival (the clock in ns,
strictly increasing per gateway; :class:`~dsec.gateway.projects.line.SharedLine`). One
with ``wait_s`` > 0 that finds its project's quota (or the cluster) full, or an earlier
create of its project waiting on any gateway, puts its ticket in the store's line and
joins its project's line on this gateway, in ticket order. Only the head of a gateway's
line tries again: when room comes free on this gateway, when another gateway commits
something to the store (``PRAGMA data_version``, read every ``tick_s`` while anyone
waits here) or every ``poll_s``; and it is admitted only when no earlier ticket of its
project waits in the store. A newcomer joins behind anyone waiting, so it never takes
room before an earlier create of its project, and a create keeps its place (its ticket)
for as long as it waits: one that was admitted but found no node with room goes back to
its place while it backs off, and a batch stays at the head until its last item fits.
``wait_s`` = 0 answers at once. After ``wait_s`` it answers ``QuotaExceeded`` with
``Retry-After``.

Every grant is also checked against arrival order by
:class:`~dsec.gateway.projects.order.ArrivalOrder`, which counts (Prometheus
``dsec_gateway_admissions_out_of_order_total``, per project) any grant made while an
earlier create of its project was still waiting, here or in the store's line: 0 when the
line keeps its order.

The reservations asked for in one turn of the event loop are taken in one transaction
(group commit: a commit was most of an admission's cost), decided in arrival order, each
as it would have been alone. A reservation that nothing can refuse (no quota or rate on
its project's chain, nobody of its project in line here or in the store) takes no
transaction of its own at all (:meth:`~dsec.gateway.projects.ledger.Ledger.take_unbounded`).
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections.abc import Awaitable, Callable

from dsec.api.errors import QuotaExceeded
from dsec.api.projects import Quota, ancestors
from dsec.gateway import metrics
from dsec.gateway.projects.ledger import Ledger, Reservation
from dsec.gateway.projects.line import SharedLine
from dsec.gateway.projects.order import ArrivalOrder, earlier_elsewhere_in
from dsec.gateway.projects.quota import Ask

__all__ = ["Admission"]

log = logging.getLogger("dsec.gateway")
_BEHIND = "waiting behind earlier creates of this project"
_BEHIND_ELSEWHERE = f"{_BEHIND} (on another gateway)"


class _Waiter:
    __slots__ = ("ticket", "woken")

    def __init__(self, ticket: int) -> None:
        self.ticket = ticket
        self.woken = asyncio.Event()


class _Spot:
    """One request's place: its ticket from arrival, its waiter while it is in line,
    whether it waits for room (from arrival until a grant; again when it comes back),
    whether its ticket is in the store's line, and whether its grant passed a ticket of
    another gateway (the order check's verdict)."""

    __slots__ = ("path", "ticket", "waiter", "waiting", "entered", "passed")

    def __init__(self, path: str, ticket: int) -> None:
        self.path, self.ticket = path, ticket
        self.waiter: _Waiter | None = None
        self.waiting = True
        self.entered = False
        self.passed = False


class _Try:
    """One reservation asked for in the current group."""

    __slots__ = ("spot", "ask", "partial", "waits", "fut")

    def __init__(self, spot: _Spot, ask: Ask, partial: bool, waits: bool,
                 fut: asyncio.Future) -> None:
        self.spot, self.ask, self.partial, self.waits, self.fut = spot, ask, partial, waits, fut


class Admission:
    """The admission queues of one gateway; ``line`` is its side of the store's line
    (by default on the ledger's connection, under a new gateway id)."""

    def __init__(self, ledger: Ledger, quotas: Callable[[list[str]], dict[str, Quota]],
                 poll_s: float = 0.2, order: ArrivalOrder | None = None,
                 line: SharedLine | None = None, tick_s: float = 0.005) -> None:
        self.ledger, self.quotas, self.poll_s, self.tick_s = ledger, quotas, poll_s, tick_s
        self._group: list[_Try] = []  # reservations asked for in this loop turn
        self.lines: dict[str, list[_Waiter]] = {}  # per project, in ticket order
        self.order = order or ArrivalOrder(metrics.admitted)
        self.line = line or SharedLine(ledger.conn)
        self._watcher: asyncio.Task | None = None
        self._unleft: list[int] = []  # tickets whose rows a failed write left in the store

    def freed(self) -> None:
        """Room came free (a sandbox stopped): the head of each line tries again. Only
        heads are woken, so a stop costs the same with ten waiters or ten thousand."""
        for line in self.lines.values():
            line[0].woken.set()

    def give_back(self, keys: list[str]) -> None:
        """Room taken for sandboxes that were not made: back to the ledger, and the heads
        of the lines try again now rather than at their next poll."""
        if keys:
            self.ledger.release(keys)
            self.freed()

    # ---- the line ----
    def _spot(self, path: str) -> _Spot:
        spot = _Spot(path, self.line.arrival())
        self.order.waiting(path, spot.ticket)
        return spot

    def _granted(self, spot: _Spot, res: Reservation) -> Reservation:
        spot.waiting = False
        self.order.granted(spot.path, spot.ticket, spot.passed)
        return res

    def _done(self, spot: _Spot) -> None:
        """The request is answered: out of line (here and in the store), and waiting no
        more."""
        self._leave(spot)
        if spot.entered:
            spot.entered = False
            try:
                self.line.leave(spot.ticket)
            except Exception:  # its row must not hold the line up: the watcher retries
                log.exception("taking a ticket out of the shared line failed")
                self._unleft.append(spot.ticket)
                self._watch()
        if spot.waiting:
            spot.waiting = False
            self.order.gone(spot.path, spot.ticket)

    def _enter(self, spot: _Spot) -> None:
        """The spot's ticket back in the store's line, at its arrival."""
        if not spot.entered:
            self.line.enter(spot.path, spot.ticket)
            spot.entered = True
            self._watch()

    def _join(self, spot: _Spot) -> _Waiter:
        """In line at the place of its ticket: the end for a newcomer, further up for a
        request that arrived earlier and comes back (tickets only grow)."""
        if not spot.waiting:  # back after a grant: waiting for room again
            spot.waiting = True
            self.order.waiting(spot.path, spot.ticket)
        if spot.waiter is None:
            me = spot.waiter = _Waiter(spot.ticket)
            line = self.lines.setdefault(spot.path, [])
            if not line or line[-1].ticket < me.ticket:
                line.append(me)
            else:
                line.insert(bisect.bisect(line, me.ticket, key=lambda w: w.ticket), me)
            self._watch()
        return spot.waiter

    def _leave(self, spot: _Spot) -> None:
        if spot.waiter is None:
            return
        line = self.lines[spot.path]
        line.remove(spot.waiter)
        spot.waiter = None
        if line:
            line[0].woken.set()  # the next in line may fit in what is left
        else:
            del self.lines[spot.path]

    # ---- group commit ----
    def _try(self, spot: _Spot, ask: Ask, partial: bool, waits: bool) -> asyncio.Future:
        """The reservation for ``ask``, taken with the others asked for in this turn of
        the event loop in one transaction (one commit for a group of creates, not one
        each; ``call_soon``, so none waits for a timer)."""
        fut = asyncio.get_running_loop().create_future()
        self._group.append(_Try(spot, ask, partial, waits, fut))
        if len(self._group) == 1:
            asyncio.get_running_loop().call_soon(self._commit)
        return fut

    def _commit(self) -> None:
        """Decide a group in arrival order, as one after another would have been: one
        refused that will wait joins its line here and in the store, before anyone hears
        an answer, and a later one of its project in the group is behind it, not tried."""
        # a caller cancelled before its turn has gone: no room and no place for it
        group, self._group = [t for t in self._group if not t.fut.done()], []
        if not group:
            return
        out: list[Reservation] = []
        waiting: list[_Try] = []
        blocked: set[str] = set()
        mine = dict(self.line.mine)  # what the store's line holds of ours, if this fails
        entered: dict[_Spot, bool] = {}
        try:
            with self.ledger.transaction():
                for unleft in self._unleft:
                    self.line.leave_in(unleft)
                for t in group:
                    res = self._decide_in(t, blocked, entered)
                    if res.problem is not None and t.waits:
                        blocked.add(t.spot.path)
                        waiting.append(t)
                    out.append(res)
        except BaseException as exc:  # noqa: BLE001 - each caller hears it
            self.line.mine = mine
            for t in group:
                if not t.fut.done():
                    t.fut.set_exception(exc)
            return
        self._unleft.clear()
        for spot, now_in in entered.items():
            spot.entered = now_in
        for t in waiting:
            self._join(t.spot)
        for t, res in zip(group, out):
            t.fut.set_result(res)
        if entered:
            self._watch()

    def _decide_in(self, t: _Try, blocked: set[str], entered: dict[_Spot, bool]
                   ) -> Reservation:
        """One try of a group, inside its transaction: behind an earlier waiter (of this
        group, this gateway's line or the store's), else what the ledger gives. A refusal
        that waits puts its ticket in the store's line; a grant takes it out, unless the
        rest of a batch waits on at its place."""
        spot, path = t.spot, t.spot.path
        if path in blocked or (spot.waiter is None and self.lines.get(path)):
            res = Reservation(path, problem=_BEHIND)
        elif (first := self.line.earliest_in(path, spot.ticket)) is not None:
            res = Reservation(path, problem=_BEHIND if first[1] == self.line.gateway
                              else _BEHIND_ELSEWHERE, retry_after_s=self.poll_s)
        else:
            res = self.ledger.take(path, self.quotas(ancestors(path)), t.ask, t.partial)
        was_in = entered.get(spot, spot.entered)
        if res.problem is None:
            spot.passed = earlier_elsewhere_in(self.ledger.conn, path, spot.ticket,
                                               self.line.gateway,
                                               time.time() - self.line.lease_s)
        stays = t.waits and (res.problem is not None or len(res.keys) < t.ask.count)
        if stays and not was_in:
            self.line.enter_in(path, spot.ticket)
            entered[spot] = True
        elif was_in and not stays:
            self.line.leave_in(spot.ticket)
            entered[spot] = False
        return res

    def _unrefusable(self, spot: _Spot, ask: Ask) -> Reservation | None:
        """The grant, without a transaction of its own, when nothing could refuse it: no
        level of the project's chain has a quota or a rate, and no create of the project
        waits in line, here or (an earlier ticket) in the store's line; else None."""
        path = spot.path
        if self.lines.get(path) or self._unleft:
            return None
        if any(_bounds(q) for q in self.quotas(ancestors(path)).values()):
            return None
        if self.line.earliest_in(path, spot.ticket) is not None:
            return None
        return self.ledger.take_unbounded(path, ask)

    async def _reserve(self, spot: _Spot, ask: Ask, deadline: float, wait_s: float,
                       partial: bool, clock: Callable[[], float]) -> Reservation:
        """Room for ``ask``: at once when nobody is in line, else in line at the spot's
        place until it fits at the head (the spot stays in line; its caller leaves)."""
        if spot.waiter is None and (res := self._unrefusable(spot, ask)) is not None:
            return self._granted(spot, res)
        if spot.waiter is None and (wait_s > 0 or not self.lines.get(spot.path)):
            # a newcomer behind this gateway's waiters tries too, with wait_s: its group
            # refuses it and puts its ticket in the store's line, where other gateways
            # see it
            res = await self._try(spot, ask, partial, wait_s > 0)
            if res.problem is None:
                return self._granted(spot, res)
            if wait_s <= 0:
                return _or_raise(res, wait_s)
        me = self._join(spot)
        res = Reservation(spot.path, problem=_BEHIND)
        while True:
            head = self.lines[spot.path][0] is me
            if head:
                res = await self._try(spot, ask, partial, deadline > clock())
                if res.problem is None:
                    return self._granted(spot, res)
            left = deadline - clock()
            if left <= 0:
                return _or_raise(res, wait_s)
            # a head also looks again every poll_s: other gateways free room unseen
            nap = min(left, self.poll_s, max(res.retry_after_s, 0.01)) if head else left
            me.woken.clear()
            try:  # not wait_for: on 3.11 it loses a cancel that meets a wakeup
                async with asyncio.timeout(nap):
                    await me.woken.wait()
            except TimeoutError:
                pass

    # ---- what the routes call ----
    async def admit(self, path: str, ask: Ask, wait_s: float, partial: bool = False,
                    clock: Callable[[], float] = time.monotonic) -> Reservation:
        """Room for ``ask`` in ``path`` (with ``partial``, for one or more of it), waiting
        in line up to ``wait_s``; QuotaExceeded once that has passed."""
        spot = self._spot(path)
        try:
            return await self._reserve(spot, ask, clock() + wait_s, wait_s, partial, clock)
        finally:
            self._done(spot)

    async def hold(self, path: str, ask: Ask, wait_s: float,
                   attempt: Callable[[Reservation], Awaitable[object]],
                   retryable: type[Exception]) -> object:
        """Admit, then run ``attempt``; when it fails the room is given back, and when it
        failed with ``retryable`` (no node has room) it waits again within ``wait_s``, at
        the place in line it arrived at. ``attempt`` confirms the reservation itself once
        the sandbox exists."""
        clock = time.monotonic
        deadline = clock() + wait_s
        spot = self._spot(path)
        try:
            while True:
                res = await self._reserve(spot, ask, deadline, wait_s, False, clock)
                self._leave(spot)  # admitted: the next in line may take what is left
                try:
                    return await attempt(res)
                except retryable:
                    self.give_back(res.keys)
                    if clock() + self.poll_s >= deadline:
                        raise
                    # back off at its own place: a newcomer (on any gateway) must not
                    # take the room it gave back, nor any that comes free meanwhile
                    self._join(spot)
                    self._enter(spot)
                    await asyncio.sleep(self.poll_s)
                except BaseException:
                    self.give_back(res.keys)
                    raise
        finally:
            self._done(spot)

    async def in_runs(self, path: str, ask: Ask, wait_s: float,
                      run: Callable[[Reservation], Awaitable[None]]) -> QuotaExceeded | None:
        """Admit the ``ask.count`` items of a batch in runs: as many as fit now, then the
        rest as room comes free, up to ``wait_s``. ``run(res)`` makes one run's
        ``len(res.keys)`` items (and confirms or gives back their room). Until its last
        item is admitted the batch keeps its place in line, at the head once it had its
        first run, so room that comes free meanwhile is its own. Returns None when every
        item had its run, else the QuotaExceeded the items left get."""
        clock = time.monotonic
        deadline = clock() + wait_s
        spot = self._spot(path)
        left = ask.count
        try:
            while left:
                try:
                    res = await self._reserve(spot, Ask(left, ask.cpu, ask.memory_mb),
                                              deadline, wait_s, True, clock)
                except QuotaExceeded as exc:
                    return exc
                left -= len(res.keys)
                if left:
                    self._join(spot)  # the rest waits at the head, before later arrivals
                else:
                    self._leave(spot)
                await run(res)
            return None
        finally:
            self._done(spot)

    # ---- hearing of the other gateways ----
    def _watch(self) -> None:
        """Watch the store while anyone waits here (started by the first to wait)."""
        if self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self._watch_store())

    async def _watch_store(self) -> None:
        """Every ``tick_s`` while this gateway has waiters: when another gateway has
        committed to the store since (room freed, a ticket gone), the heads try again;
        and this gateway's tickets stay alive (its beat)."""
        conn = self.ledger.conn
        try:
            seen = conn.execute("PRAGMA data_version").fetchone()[0]
            while self.lines or self.line.mine or self._unleft:
                await asyncio.sleep(self.tick_s)
                try:
                    now = conn.execute("PRAGMA data_version").fetchone()[0]
                    if now != seen:
                        seen = now
                        self.freed()
                    if self._unleft:
                        self._leave_unleft()
                    self.line.beat()
                except Exception:  # a busy store this tick; the next one tries again
                    log.exception("watching the shared admission line failed")
        finally:
            self._watcher = None

    def _leave_unleft(self) -> None:
        with self.ledger.transaction():
            for at in self._unleft:
                self.line.leave_in(at)
        self._unleft.clear()

    def close(self) -> None:
        """This gateway ends: it stops watching, and its tickets leave the store."""
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None
        self.line.close()


def _bounds(quota: Quota) -> bool:
    """Whether ``quota`` limits anything (a field or the creation rate set). Pure."""
    return (quota.sandboxes is not None or quota.cpu is not None
            or quota.memory_mb is not None or quota.creations_per_s is not None)


def _or_raise(res: Reservation, wait_s: float) -> Reservation:
    if res.problem is None:
        return res
    # 3 digits: a wait the caller asked for (hold passes what is left of it, 0.999999)
    waited = f" after waiting {wait_s:.3g}s" if wait_s > 0 else ""
    raise QuotaExceeded(f"{res.problem}{waited}; stop some, wait (wait_s=...) or ask an admin "
                        "for more", retry_after_s=res.retry_after_s)
