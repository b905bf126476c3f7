"""A check on queued admission: is each grant the earliest arrival of its project still
waiting?

:class:`ArrivalOrder` keeps the tickets of the creates still waiting for room, per
project, apart from the lines of :mod:`dsec.gateway.projects.admission`. Admission tells
it when a ticket starts waiting, is granted room, or gives up. A grant while an earlier
ticket of the same project still waits is out of arrival order. The check only counts,
it never prevents; because it does not read the lines, a line that lost its order would
show here, whatever the line's own code believes.

Across gateways, :func:`earlier_elsewhere_in` asks the store itself, inside the grant's
transaction, whether a live ticket of another gateway that arrived earlier still waits:
a grant that passes one counts as out of order on the gateway that made it.
"""

from __future__ import annotations

import heapq
import sqlite3
from collections.abc import Callable

__all__ = ["ArrivalOrder", "earlier_elsewhere_in"]


def earlier_elsewhere_in(conn: sqlite3.Connection, path: str, ticket: int, gateway: str,
                         alive_after: float) -> bool:
    """Whether a ticket of ``path`` that arrived before ``ticket`` waits in the store's
    line for a gateway other than ``gateway`` that was seen after ``alive_after``. Read
    inside the grant's own transaction, so it sees what the grant saw."""
    return conn.execute(
        "SELECT 1 FROM line l JOIN gateways g ON g.id = l.gateway WHERE l.path = ? "
        "AND l.at < ? AND l.gateway != ? AND g.seen >= ? LIMIT 1",
        (path, ticket, gateway, alive_after)).fetchone() is not None


class ArrivalOrder:
    """Waiting tickets per project; ``on_grant(project, in_order)`` hears every grant."""

    def __init__(self, on_grant: Callable[[str, bool], None]) -> None:
        self.on_grant = on_grant
        self._heaps: dict[str, list[int]] = {}  # smallest waiting ticket on top
        self._live: dict[str, set[int]] = {}    # what is still waiting; the heap is lazy

    def waiting(self, path: str, ticket: int) -> None:
        """``ticket`` arrived, or came back to wait again (a create that found no node)."""
        heapq.heappush(self._heaps.setdefault(path, []), ticket)
        self._live.setdefault(path, set()).add(ticket)

    def gone(self, path: str, ticket: int) -> None:
        """``ticket`` waits no more: it gave up (``wait_s`` ran out) or was granted."""
        live = self._live.get(path)
        if live is None:
            return
        live.discard(ticket)
        heap = self._heaps[path]
        while heap and heap[0] not in live:
            heapq.heappop(heap)
        if not heap:
            del self._heaps[path], self._live[path]

    def granted(self, path: str, ticket: int, passed_elsewhere: bool = False) -> bool:
        """``ticket`` got room: in order unless an earlier ticket of ``path`` still waits
        here, or (``passed_elsewhere``, from :func:`earlier_elsewhere_in`) on another
        gateway."""
        self.gone(path, ticket)
        heap = self._heaps.get(path)
        in_order = (not heap or heap[0] > ticket) and not passed_elsewhere
        self.on_grant(path, in_order)
        return in_order
