"""The one line of all gateways sharing the control store: who waits, in arrival order.

A create that has to wait for room puts a row in the store's ``line`` table: its project,
its arrival (nanoseconds since the epoch when its gateway started on it, made strictly
increasing per gateway) and its gateway's id. Every admission, on any gateway, first asks
whether a row of its project that arrived earlier is still waiting; if one is, it waits
behind it. Both happen inside the admission's own write transaction (the group commit of
:mod:`dsec.gateway.projects.admission`), so no create slips between a refusal and its row.
A create that fits at once, with no one of its project waiting, writes nothing here: the
check is one indexed read.

Rows live only while their gateway does: a gateway that has rows in the line says so in
``gateways`` every :data:`BEAT_S`, and rows of a gateway not seen for :data:`LEASE_S`
(it crashed, or stalled that long) count for nothing and are deleted by whoever meets
them. A gateway that comes back from a stall puts a row back at its old arrival when its
create tries again, so it regains its place, though creates may have passed it meanwhile.
"""

from __future__ import annotations

import secrets
import sqlite3
import time

from dsec.gateway.projects.db import write

__all__ = ["SharedLine", "LEASE_S", "BEAT_S"]

LEASE_S = 10.0  # a gateway not seen this long has crashed: its rows hold no one up
BEAT_S = 1.0    # how often a gateway with rows in the line says it is alive


class SharedLine:
    """This gateway's side of the line in the store on ``conn``. Methods named ``*_in``
    run inside a write transaction the caller holds."""

    def __init__(self, conn: sqlite3.Connection, gateway: str | None = None,
                 lease_s: float = LEASE_S, beat_s: float = BEAT_S) -> None:
        self.conn = conn
        self.gateway = gateway or f"gw-{secrets.token_hex(6)}"
        self.lease_s, self.beat_s = lease_s, beat_s
        self.mine: dict[int, str] = {}  # arrival -> project of this gateway's rows
        self.beat_at = 0.0           # time.time() of the last beat written
        self._last = 0

    def arrival(self) -> int:
        """A new arrival key: the clock in ns, strictly increasing on this gateway (a
        clock stepped back must not put a later create ahead of an earlier one)."""
        self._last = max(self._last + 1, time.time_ns())
        return self._last

    def earliest_in(self, path: str, before: int) -> tuple[int, str] | None:
        """The earliest live row of ``path`` that arrived before ``before`` (this
        gateway's own rows included), as (arrival, gateway); None if there is none.
        Rows of crashed gateways met on the way are deleted."""
        while True:
            rows = self.conn.execute(
                "SELECT l.at, l.gateway, g.seen FROM line l LEFT JOIN gateways g "
                "ON g.id = l.gateway WHERE l.path = ? AND l.at < ? ORDER BY l.at LIMIT 16",
                (path, before)).fetchall()
            if not rows:
                return None
            alive_after = time.time() - self.lease_s
            for at, gw, seen in rows:
                if gw == self.gateway or (seen is not None and seen >= alive_after):
                    return at, gw
            self._purge_in(alive_after)  # all stale: gone, then look again

    def _purge_in(self, alive_after: float) -> None:
        self.conn.execute("DELETE FROM line WHERE gateway NOT IN "
                          "(SELECT id FROM gateways WHERE seen >= ?) AND gateway != ?",
                          (alive_after, self.gateway))
        self.conn.execute("DELETE FROM gateways WHERE seen < ? AND id != ?",
                          (alive_after, self.gateway))

    def enter_in(self, path: str, at: int) -> None:
        """A row for the create that arrived at ``at`` (again, if it had one before)."""
        if not self.mine or time.time() - self.beat_at >= self.beat_s:
            self._beat_in()
        self.conn.execute("INSERT OR IGNORE INTO line (gateway, at, path) VALUES (?, ?, ?)",
                          (self.gateway, at, path))
        self.mine[at] = path

    def leave_in(self, at: int) -> None:
        self.conn.execute("DELETE FROM line WHERE gateway = ? AND at = ?", (self.gateway, at))
        self.mine.pop(at, None)

    def leave(self, at: int) -> None:
        """:meth:`leave_in` in a transaction of its own (a create that gave up)."""
        with write(self.conn):
            self.leave_in(at)

    def enter(self, path: str, at: int) -> None:
        with write(self.conn):
            self.enter_in(path, at)

    def _beat_in(self) -> None:
        self.beat_at = time.time()
        if self.conn.execute("UPDATE gateways SET seen = ? WHERE id = ?",
                             (self.beat_at, self.gateway)).rowcount:
            return
        # first beat, or another gateway took this one for crashed (it stalled past the
        # lease) and deleted its rows: they come back at their own arrivals
        self.conn.execute("INSERT INTO gateways (id, seen) VALUES (?, ?)",
                          (self.gateway, self.beat_at))
        self.conn.executemany("INSERT OR IGNORE INTO line (gateway, at, path) "
                              "VALUES (?, ?, ?)",
                              [(self.gateway, at, p) for at, p in self.mine.items()])

    def beat(self) -> None:
        """Say this gateway is alive, if it has rows in the line and the last beat is
        :attr:`beat_s` old (and put back its rows if another gateway deleted them)."""
        if not self.mine or time.time() - self.beat_at < self.beat_s:
            return
        with write(self.conn):
            self._beat_in()

    def close(self) -> None:
        """This gateway ends: its rows go (the creates they stood for are answered)."""
        with write(self.conn):
            self.conn.execute("DELETE FROM line WHERE gateway = ?", (self.gateway,))
            self.conn.execute("DELETE FROM gateways WHERE id = ?", (self.gateway,))
        self.mine.clear()
