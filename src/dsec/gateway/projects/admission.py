"""Queued admission: a create that does not fit waits, first come first served per project.

A create with ``wait_s`` > 0 that finds its project's quota (or the cluster) full joins
its project's queue on this gateway; only the head of a queue tries again, when a
sandbox of this gateway stops or every ``poll_s`` (other gateways sharing the store free
room too), so later arrivals never overtake it. ``wait_s`` = 0 answers at once. After
``wait_s`` it answers ``QuotaExceeded`` with ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable

from dsec.api.errors import QuotaExceeded
from dsec.api.projects import Quota, ancestors
from dsec.gateway.projects.ledger import Ledger, Reservation
from dsec.gateway.projects.quota import Ask

__all__ = ["Admission"]


class _Waiter:
    __slots__ = ("woken",)

    def __init__(self) -> None:
        self.woken = asyncio.Event()


class Admission:
    def __init__(self, ledger: Ledger, quotas: Callable[[list[str]], dict[str, Quota]],
                 poll_s: float = 0.2) -> None:
        self.ledger, self.quotas, self.poll_s = ledger, quotas, poll_s
        self.queues: dict[str, deque[_Waiter]] = {}

    def freed(self) -> None:
        """Room came free (a sandbox stopped): the head of each queue tries again. Only
        heads are woken, so a stop costs the same with ten waiters or ten thousand."""
        for queue in self.queues.values():
            queue[0].woken.set()

    def _try(self, path: str, ask: Ask, partial: bool) -> Reservation:
        return self.ledger.reserve(path, self.quotas(ancestors(path)), ask, partial)

    async def admit(self, path: str, ask: Ask, wait_s: float, partial: bool = False,
                    clock: Callable[[], float] = time.monotonic) -> Reservation:
        """Room for ``ask`` in ``path`` (with ``partial``, for one or more of it), waiting
        in line up to ``wait_s``; QuotaExceeded once that has passed."""
        if not self.queues.get(path):  # nobody is waiting: no line to join
            res = self._try(path, ask, partial)
            if res.problem is None or wait_s <= 0:
                return _or_raise(res, wait_s)
        return await self._wait_in_line(path, ask, wait_s, partial, clock)

    async def _wait_in_line(self, path: str, ask: Ask, wait_s: float, partial: bool,
                            clock) -> Reservation:
        deadline = clock() + wait_s
        queue = self.queues.setdefault(path, deque())
        me = _Waiter()
        queue.append(me)
        res = Reservation(path, problem="waiting behind earlier creates of this project")
        try:
            while True:
                head = queue[0] is me
                if head:
                    res = self._try(path, ask, partial)
                    if res.problem is None:
                        return res
                left = deadline - clock()
                if left <= 0:
                    return _or_raise(res, wait_s)
                # a head also looks again every poll_s: other gateways free room unseen
                nap = min(left, self.poll_s, max(res.retry_after_s, 0.01)) if head else left
                me.woken.clear()
                try:
                    await asyncio.wait_for(me.woken.wait(), nap)
                except TimeoutError:
                    pass
        finally:
            queue.remove(me)
            if queue:
                queue[0].woken.set()  # the next in line may fit in what is left
            else:
                self.queues.pop(path, None)

    async def hold(self, path: str, ask: Ask, wait_s: float,
                   attempt: Callable[[Reservation], Awaitable[object]],
                   retryable: type[Exception]) -> object:
        """Admit, then run ``attempt``; when it fails the room is given back, and when it
        failed with ``retryable`` (no node has room) it waits again within ``wait_s``.
        ``attempt`` confirms the reservation itself once the sandbox exists."""
        deadline = time.monotonic() + wait_s
        while True:
            res = await self.admit(path, ask, max(0.0, deadline - time.monotonic()))
            try:
                return await attempt(res)
            except retryable:
                self.ledger.release(res.keys)
                if time.monotonic() + self.poll_s >= deadline:
                    raise
                await asyncio.sleep(self.poll_s)
            except BaseException:
                self.ledger.release(res.keys)
                raise


def _or_raise(res: Reservation, wait_s: float) -> Reservation:
    if res.problem is None:
        return res
    # 3 digits: a wait the caller asked for (hold passes what is left of it, 0.999999)
    waited = f" after waiting {wait_s:.3g}s" if wait_s > 0 else ""
    raise QuotaExceeded(f"{res.problem}{waited}; stop some, wait (wait_s=...) or ask an admin "
                        "for more", retry_after_s=res.retry_after_s)
