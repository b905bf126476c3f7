"""What each project holds, as the gateways see it: admission, and keeping it true.

A row of ``held`` per sandbox: taken at admission (before the node is asked, so creates
in flight count, from every gateway sharing the store), given its sandbox id when the
node answers, dropped when the sandbox stops through a gateway. ``usage`` keeps each
project's rolled-up sums, so an admission reads one row per level instead of summing.
Sandboxes can also end on their own (TTL, idle, a job stopped, a node lost); the nodes'
records are the truth of what exists, and :meth:`Ledger.reconcile` brings the rows of a
node back to what that node lists.

Only a reservation (and a stop) must be a transaction of its own: the count it changes
is what every gateway admits against. Giving a row its sandbox id changes no count, so a
gateway with a running loop (:attr:`Ledger.defer`) keeps its confirmations in memory and
writes them in its next write transaction, or at the latest :data:`FLUSH_S` later: a
create then costs one write transaction instead of two. Until then the row counts as a
create in flight (as it did while the node worked), so no quota can be exceeded by it.

A reservation in a project that no level above or at it bounds (no quota field and no
creation rate set anywhere on its chain) cannot be refused, so it need not be a
transaction of its own either: :meth:`Ledger.take_unbounded` keeps its rows in memory
with the confirmations, written the same way (a commit was a third of a create's time
through the gateway). Decision: the one thing that could have used them at once is a
quota an admin sets on that chain meanwhile; this gateway writes what it keeps before
it writes any project change, and another gateway may admit against the new quota
without the creates this one made in the last :data:`FLUSH_S` (a quota set while creates
are under way was never ordered against them; a quota below usage is allowed and only
stops new creates).
"""

from __future__ import annotations

import math
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from dsec.api.projects import Quota, Usage, ancestors
from dsec.gateway.projects.db import write
from dsec.gateway.projects.quota import Ask, admit_problem, refill

__all__ = ["Ledger", "Reservation", "ADOPT_AFTER_S", "PENDING_FOR_S", "FLUSH_S"]

ADOPT_AFTER_S = 60.0   # a sandbox no row knows, this old, was made before (or around) us
PENDING_FOR_S = 600.0  # a reservation never confirmed this long: its gateway died mid-create
FLUSH_S = 0.05         # confirmations kept in memory at most this long (see above)
CHUNK = 1000           # rows per statement, and per transaction when reconciling in steps


def chunks(items: list, n: int = CHUNK) -> Iterator[list]:
    return (items[i:i + n] for i in range(0, len(items), n))


@dataclass
class Reservation:
    """Room taken for ``len(keys)`` sandboxes of ``path``; or why none was."""

    path: str
    keys: list[str] = field(default_factory=list)
    problem: str | None = None
    retry_after_s: float = 1.0


def _per_project(rows) -> dict[str, list]:
    """``[sandboxes, cpu, memory_mb]`` per project of held rows (key, path, cpu,
    memory_mb, ...): one usage update per project, not per row. Pure."""
    per: dict[str, list] = {}
    for row in rows:
        t = per.setdefault(row[1], [0, 0.0, 0])
        t[0], t[1], t[2] = t[0] + 1, t[1] + row[2], t[2] + row[3]
    return per


def _fits(chain: list[tuple[str, Quota, Usage]], ask: Ask) -> int:
    """How many of ``ask.count`` fit under every level's quota. Pure."""
    n = ask.count
    for _, quota, usage in chain:
        for name, per in (("sandboxes", 1), ("cpu", ask.cpu), ("memory_mb", ask.memory_mb)):
            top = getattr(quota, name)
            if top is not None and per > 0:
                n = min(n, max(0, math.floor((top - getattr(usage, name)) / per + 1e-9)))
    return n


class Ledger:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        # set by the gateway's loop: called when confirmations wait, it arranges for
        # flush() within FLUSH_S; None confirms at once (no loop to flush later)
        self.defer: Callable[[], None] | None = None
        self._confirms: list[tuple[str, str, str, float]] = []
        self._takes: list[tuple[str, Ask, list[str], float]] = []  # see take_unbounded
        # per node, when the first sandbox it listed that no row knows may be adopted
        # (time.time()); the reconcile takes it (see Projects.reconcile)
        self.adopt_due: dict[str, float] = {}

    @contextmanager
    def _write(self) -> Iterator[None]:
        """A write transaction that first writes the reservations and confirmations
        waiting in memory (kept for the next one if it rolls back)."""
        takes, self._takes = self._takes, []
        waiting, self._confirms = self._confirms, []
        try:
            with write(self.conn):
                self._apply(takes, waiting)
                yield
        except BaseException:
            self._takes[:0] = takes
            self._confirms[:0] = waiting
            raise

    @property
    def waiting(self) -> bool:
        """Whether reservations or confirmations wait in memory to be written."""
        return bool(self._confirms or self._takes)

    def flush(self) -> None:
        """Write the reservations and confirmations waiting in memory now."""
        if self.waiting:
            with self._write():
                pass

    def _usage(self, paths: list[str]) -> dict[str, tuple]:
        marks = ",".join("?" * len(paths))
        rows = self.conn.execute("SELECT path, sandboxes, cpu, memory_mb, bucket, bucket_at "
                                 f"FROM usage WHERE path IN ({marks})", paths).fetchall()
        return {r[0]: r[1:] for r in rows}

    def _add(self, path: str, n: int, cpu: float, memory_mb: int) -> None:
        self.conn.executemany(
            "INSERT INTO usage (path, sandboxes, cpu, memory_mb) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(path) DO UPDATE SET sandboxes = sandboxes + excluded.sandboxes, "
            "cpu = cpu + excluded.cpu, memory_mb = memory_mb + excluded.memory_mb",
            [(p, n, cpu, memory_mb) for p in ancestors(path)])

    def reserve(self, path: str, quotas: dict[str, Quota], ask: Ask,
                partial: bool = False) -> Reservation:
        """Take room for ``ask`` (with ``partial``, for as many of it as fit) under every
        quota from the root down to ``path``, in one transaction."""
        with self._write():
            return self.take(path, quotas, ask, partial)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One write transaction for several :meth:`take` (a group of admissions: one
        commit instead of one per create)."""
        with self._write():
            yield

    def take(self, path: str, quotas: dict[str, Quota], ask: Ask,
             partial: bool = False) -> Reservation:
        """:meth:`reserve` inside a :meth:`transaction` the caller holds."""
        chain_paths = ancestors(path)
        now = time.time()
        used = self._usage(chain_paths)
        chain = [(p, quotas.get(p) or Quota(),
                  Usage(**dict(zip(("sandboxes", "cpu", "memory_mb"), used[p][:3])))
                  if p in used else Usage()) for p in chain_paths]
        n = _fits(chain, ask)
        rates = [(p, quotas[p].creations_per_s) for p in chain_paths
                 if p in quotas and quotas[p].creations_per_s is not None]
        buckets = {}
        for p, rate in rates:
            tokens = refill(*(used[p][3:5] if p in used else (None, None)), rate, now)
            buckets[p] = tokens
            n = min(n, math.floor(tokens + 1e-9))
        if n < (1 if partial else ask.count):
            return self._refusal(path, chain, ask, rates, buckets, n)
        for p, rate in rates:
            self.conn.execute(
                "INSERT INTO usage (path, bucket, bucket_at) VALUES (?, ?, ?) "
                "ON CONFLICT(path) DO UPDATE SET bucket = excluded.bucket, "
                "bucket_at = excluded.bucket_at", (p, buckets[p] - n, now))
        keys = [f"res-{secrets.token_hex(8)}" for _ in range(n)]
        self.conn.executemany("INSERT INTO held (key, path, cpu, memory_mb, at) "
                              "VALUES (?, ?, ?, ?, ?)",
                              [(k, path, ask.cpu, ask.memory_mb, now) for k in keys])
        self._add(path, n, ask.cpu * n, ask.memory_mb * n)
        return Reservation(path, keys)

    def take_unbounded(self, path: str, ask: Ask) -> Reservation:
        """Room for ``ask`` in ``path``, whose chain has no quota and no rate (the caller
        checked): its rows are written with the next write, or within FLUSH_S when
        :attr:`defer` is set, at once otherwise (see the module's docstring)."""
        keys = [f"res-{secrets.token_hex(8)}" for _ in range(ask.count)]
        self._takes.append((path, ask, keys, time.time()))
        if self.defer is None:
            self.flush()
        else:
            self.defer()
        return Reservation(path, keys)

    def _refusal(self, path, chain, ask, rates, buckets, n) -> Reservation:
        one = Ask(1, ask.cpu, ask.memory_mb) if n == 0 else ask
        if why := admit_problem(chain, one):
            return Reservation(path, problem=why)
        for p, rate in rates:
            if buckets[p] < 1:
                wait = (1 - buckets[p]) / rate if rate > 0 else 3600.0
                where = repr(p) if p else "the root project"
                return Reservation(path, problem=f"{where} may create {rate:g} sandboxes per "
                                                 "second (quota.creations_per_s)",
                                   retry_after_s=wait)
        return Reservation(path, problem=f"only {n} of the {ask.count} fit now")

    def confirm(self, made: list[tuple[str, str, str]]) -> None:
        """``(key, sb_id, node)`` per sandbox the nodes made (written now, or with the
        next write when :attr:`defer` is set)."""
        if not made:
            return
        now = time.time()
        self._confirms += [(key, sb, node, now) for key, sb, node in made]
        if self.defer is None:
            self.flush()
        else:
            self.defer()

    def _apply(self, takes: list[tuple[str, Ask, list[str], float]],
               confirms: list[tuple[str, str, str, float]]) -> None:
        """Write the reservations and confirmations kept in memory, in set-wise statements
        (row by row, a batch of 32,000 held the gateway's loop for half a second): a row
        taken and confirmed since the last write is inserted once, with its sandbox; a
        confirmation of a row written before updates it; a confirmation of a sandbox some
        row holds already (a retried request_id) drops its own row instead."""
        dup = self._duplicates(confirms)
        taken = {k for _, _, keys, _ in takes for k in keys}
        made = {key: (sb, node, at) for key, sb, node, at in confirms if key not in dup}
        rows = [(k, path, ask.cpu, ask.memory_mb, *made.get(k, (None, None, at)))
                for path, ask, keys, at in takes for k in keys if k not in dup]
        for part in chunks(rows):
            self.conn.executemany("INSERT INTO held (key, path, cpu, memory_mb, sb_id, node, "
                                  "at) VALUES (?, ?, ?, ?, ?, ?, ?)", part)
        for path, (n, cpu, mem) in _per_project(rows).items():
            self._add(path, n, cpu, mem)
        for part in chunks([(sb, node, at, key) for key, (sb, node, at) in made.items()
                            if key not in taken]):
            self.conn.executemany("UPDATE held SET sb_id = ?, node = ?, at = ? WHERE key = ?",
                                  part)
        self._drop_keys([k for k in dup if k not in taken])

    def _duplicates(self, confirms: list[tuple[str, str, str, float]]) -> set[str]:
        """The keys of ``confirms`` whose sandbox a row holds already: in the store, or
        an earlier confirmation of the same list."""
        held: set[str] = set()
        for part in chunks([c[1] for c in confirms]):
            held.update(r[0] for r in self.conn.execute(
                f"SELECT sb_id FROM held WHERE sb_id IN ({','.join('?' * len(part))})", part))
        dup = set()
        for key, sb, _, _ in confirms:
            if sb in held:
                dup.add(key)
            held.add(sb)
        return dup

    def _drop(self, where: str, args: list) -> int:
        return self._drop_rows(self.conn.execute(
            f"SELECT key, path, cpu, memory_mb FROM held WHERE {where}", args).fetchall())

    def _drop_rows(self, rows: list[tuple[str, str, float, int]]) -> int:
        """Delete ``rows`` (key, path, cpu, memory_mb) and take them out of the sums: one
        update per project, not per row (a node's 32,000 ended sandboxes were half a second
        of the gateway's loop row by row)."""
        self.conn.executemany("DELETE FROM held WHERE key = ?", [(r[0],) for r in rows])
        for path, (n, cpu, mem) in _per_project(rows).items():
            self._add(path, -n, -cpu, -mem)
        return len(rows)

    def _drop_keys(self, keys: list[str]) -> int:
        return sum(self._drop(f"key IN ({','.join('?' * len(part))})", part)
                   for part in chunks(keys))

    def release(self, keys: list[str]) -> None:
        """Give back reservations whose sandboxes were not made."""
        if keys:
            with self._write():
                self._drop_keys(keys)

    def stopped(self, *sb_ids: str) -> None:
        """Sandboxes stopped through this gateway: their rows go now (set-wise)."""
        if sb_ids:
            with self._write():
                for part in chunks(list(sb_ids)):
                    self._drop(f"sb_id IN ({','.join('?' * len(part))})", part)

    def held_on(self, node: str, before: float | None = None) -> int:
        """Rows of sandboxes on ``node`` (confirmed before ``before``, a time.time())."""
        self.flush()
        if before is None:
            return self.conn.execute("SELECT count(*) FROM held WHERE node = ?",
                                     (node,)).fetchone()[0]
        return self.conn.execute("SELECT count(*) FROM held WHERE node = ? AND at < ?",
                                 (node, before)).fetchone()[0]

    def reconcile(self, node: str, present: dict[str, tuple[str, float, int, float]],
                  listed_at: float) -> tuple[int, int]:
        """Make ``node``'s rows what it lists (``present``: sb_id -> project, cpu,
        memory_mb, created_at): rows of sandboxes gone are dropped, sandboxes no row
        knows are taken in once they are older than a create can be in flight. Returns
        (dropped, adopted)."""
        totals = [0, 0]
        for _ in self.reconcile_steps(node, present, listed_at, totals):
            pass
        return totals[0], totals[1]

    def reconcile_steps(self, node: str, present: dict[str, tuple[str, float, int, float]],
                        listed_at: float, totals: list[int]) -> Iterator[None]:
        """:meth:`reconcile` a chunk per transaction, yielding between them (the gateway's
        loop serves requests there); ``totals`` becomes [dropped, adopted]."""
        for part in chunks(self.gone(node, present, listed_at)):
            totals[0] += self.drop_gone(part)
            yield
        for part in chunks(list(present.items())):
            totals[1] += self.adopt(node, dict(part), listed_at)
            yield
        totals[0] += self.drop_stale(listed_at)

    def gone(self, node: str, present: dict, listed_at: float) -> list[str]:
        """Keys of ``node``'s rows, confirmed before ``listed_at``, whose sandbox is not in
        ``present`` (what the node listed at that time)."""
        self.flush()
        return [key for sb, key in self.conn.execute(
            "SELECT sb_id, key FROM held WHERE node = ? AND at < ?", (node, listed_at))
            if sb not in present]

    def drop_gone(self, keys: list[str]) -> int:
        """Drop the rows of ``keys`` still there (one may have been stopped meanwhile)."""
        with self._write():
            return self._drop_keys(keys)

    def adopt(self, node: str, present: dict[str, tuple[str, float, int, float]],
              listed_at: float) -> int:
        """Take in the sandboxes of ``present`` that no row knows and that are older than
        a create can be in flight; how many."""
        adopted = 0
        with self._write():
            known = {r[0] for r in self.conn.execute(
                f"SELECT sb_id FROM held WHERE sb_id IN ({','.join('?' * len(present))})",
                list(present))}
            for sb, (path, cpu, mem, created) in present.items():
                if sb in known:
                    continue
                if listed_at - created < ADOPT_AFTER_S:
                    due = created + ADOPT_AFTER_S
                    self.adopt_due[node] = min(self.adopt_due.get(node, due), due)
                    continue
                self.conn.execute("INSERT OR IGNORE INTO held (key, path, cpu, memory_mb, "
                                  "node, sb_id, at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                                  (f"res-{secrets.token_hex(8)}", path, cpu, mem, node, sb,
                                   listed_at))
                self._add(path, 1, cpu, mem)
                adopted += 1
        return adopted

    def drop_stale(self, listed_at: float) -> int:
        """Drop reservations never confirmed for PENDING_FOR_S: their gateway died."""
        with self._write():
            return self._drop("sb_id IS NULL AND at < ?", [listed_at - PENDING_FOR_S])
