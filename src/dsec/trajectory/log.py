"""The trajectory log: per sandbox, every mutating call and its result, in order, durably.

One SQLite file per node (``trajectory.db``, apart from ``node.db`` so a long log never
slows the sandbox table). Rows are append-only: triggers refuse UPDATE on steps, and
DELETE unless retention (:mod:`.retention`) is deleting that sandbox's whole log.
WAL with ``synchronous=NORMAL`` keeps an append across a SIGKILL of the node; a host crash
can lose the last ones, and takes the sandboxes with it.
The same file holds the audit records of denied actions, and ``logs``: per sandbox, its
newest entry's time, its payload bytes and when it stopped, so that a pruning pass reads
one small table. The file uses incremental vacuum: what a pass deletes goes back to disk.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dsec.api.rl import AuditRecord, TrajectoryEntry
from dsec.trajectory.retention import LogSummary, TrajectoryRetention, plan_prune
from dsec.wal import open_db

__all__ = ["TrajectoryLog", "PruneReport"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS steps (
    sandbox TEXT NOT NULL,
    seq INTEGER NOT NULL,
    step TEXT,
    kind TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    request TEXT NOT NULL,
    result TEXT NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (sandbox, seq)
) WITHOUT ROWID;
CREATE UNIQUE INDEX IF NOT EXISTS steps_by_key ON steps (sandbox, step) WHERE step IS NOT NULL;
CREATE TRIGGER IF NOT EXISTS steps_no_update BEFORE UPDATE ON steps
    BEGIN SELECT RAISE(ABORT, 'the trajectory log is append-only'); END;
CREATE TABLE IF NOT EXISTS logs (
    sandbox TEXT PRIMARY KEY,
    last_at REAL NOT NULL,
    ended_at REAL,
    bytes INTEGER NOT NULL DEFAULT 0,
    pruning INTEGER NOT NULL DEFAULT 0
);
DROP TRIGGER IF EXISTS steps_no_delete;
CREATE TRIGGER steps_no_delete BEFORE DELETE ON steps
    WHEN NOT EXISTS (SELECT 1 FROM logs WHERE sandbox = OLD.sandbox AND pruning = 1)
    BEGIN SELECT RAISE(ABORT, 'the trajectory log is append-only'); END;
CREATE TABLE IF NOT EXISTS audit (
    sandbox TEXT NOT NULL,
    at REAL NOT NULL,
    kind TEXT NOT NULL,
    detail TEXT NOT NULL,
    count INTEGER NOT NULL DEFAULT 1
);
CREATE INDEX IF NOT EXISTS audit_by_sandbox ON audit (sandbox, at);
"""
# A log written before the ``logs`` table existed gets its summaries once, on open.
BACKFILL = """
INSERT OR IGNORE INTO logs (sandbox, last_at, bytes)
    SELECT sandbox, MAX(at), SUM(length(request) + length(result)) FROM steps GROUP BY sandbox;
INSERT OR IGNORE INTO logs (sandbox, last_at, bytes)
    SELECT sandbox, MAX(at), SUM(length(detail)) FROM audit GROUP BY sandbox;
PRAGMA user_version = 1;
"""
TOUCH = """INSERT INTO logs (sandbox, last_at, bytes) VALUES (?, ?, ?)
    ON CONFLICT (sandbox) DO UPDATE SET last_at = excluded.last_at,
                                        bytes = bytes + excluded.bytes"""
VACUUM_STEP = 2048  # pages handed back per lock hold, so appends wait milliseconds at most


@dataclass
class PruneReport:
    """What one retention pass did."""

    pruned: list[str] = field(default_factory=list)  # sandboxes whose logs were deleted
    bytes_before: int = 0                             # the file (and its WAL) on disk
    bytes_after: int = 0


_NEXT_KEPT = 65536  # sandboxes whose next seq is kept (then forgotten, and looked up again)


class TrajectoryLog:
    """Append and read trajectories; thread-safe."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db = open_db(path, SCHEMA)
        self._lock = threading.Lock()
        # each sandbox's next seq once known: a query fewer per append. Another writer of
        # the file makes an insert collide on (sandbox, seq); its rollback forgets these.
        self._next: dict[str, int] = {}
        if self._pragma("user_version") < 1:
            self._db.executescript(BACKFILL)
        if self._pragma("auto_vacuum") != 2 and self._pragma("page_count") <= 64:
            self._incremental()  # a new file; an old, large one converts on its first prune

    def append(self, sandbox: str, step: str | None, kind: str, fingerprint: str,
               request: dict, result: dict) -> TrajectoryEntry:
        """Add one entry at the end of ``sandbox``'s log and return it."""
        at = time.time()
        (seq,) = self.append_many([(sandbox, step, kind, fingerprint, request, result)], at)
        return TrajectoryEntry(sandbox_id=sandbox, seq=seq, step=step, kind=kind,
                               fingerprint=fingerprint, request=request, result=result, at=at)

    def append_many(self, items: list[tuple[str, str | None, str, str, dict, dict]],
                    at: float | None = None) -> list[int]:
        """Append ``(sandbox, step, kind, fingerprint, request, result)`` items in order,
        in one transaction (all of them or, on an error, none); their sequence numbers."""
        at = time.time() if at is None else at
        rows = [(sb, step, kind, fp, json.dumps(req), json.dumps(res))
                for sb, step, kind, fp, req, res in items]
        try:
            return self._insert(rows, at)
        except sqlite3.IntegrityError:  # a known next seq taken by another writer, or a
            return self._insert(rows, at)  # step key logged already: once more, from the file

    def _insert(self, rows: list[tuple], at: float) -> list[int]:
        seqs = []
        nxt = self._next
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for sandbox, step, kind, fp, req, res in rows:
                    if (seq := nxt.get(sandbox)) is None:
                        (seq,) = self._db.execute(
                            "SELECT COALESCE(MAX(seq) + 1, 0) FROM steps WHERE sandbox=?",
                            (sandbox,)).fetchone()
                    self._db.execute("INSERT INTO steps VALUES (?,?,?,?,?,?,?,?)",
                                     (sandbox, seq, step, kind, fp, req, res, at))
                    if len(nxt) >= _NEXT_KEPT and sandbox not in nxt:
                        nxt.clear()  # a node's sandboxes come and go; a miss only queries
                    nxt[sandbox] = seq + 1
                    self._db.execute(TOUCH, (sandbox, at, len(req) + len(res)))
                    seqs.append(seq)
                self._db.execute("COMMIT")
            except BaseException:
                for sandbox, *_ in rows:
                    nxt.pop(sandbox, None)
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
        return seqs

    def entries(self, sandbox: str, offset: int = 0, limit: int = -1) -> list[TrajectoryEntry]:
        with self._lock:
            rows = self._db.execute(
                "SELECT * FROM steps WHERE sandbox=? AND seq>=? ORDER BY seq LIMIT ?",
                (sandbox, offset, limit)).fetchall()
        return [_entry(r) for r in rows]

    def entry(self, sandbox: str, seq: int) -> TrajectoryEntry | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM steps WHERE sandbox=? AND seq=?",
                                   (sandbox, seq)).fetchone()
        return _entry(row) if row else None

    def count(self, sandbox: str) -> int:
        with self._lock:
            (n,) = self._db.execute("SELECT COUNT(*) FROM steps WHERE sandbox=?",
                                    (sandbox,)).fetchone()
        return n

    def keyed(self, sandbox: str) -> list[tuple[str, int, str]]:
        """``(step, seq, fingerprint)`` of the entries that carry a step key, in order."""
        with self._lock:
            return self._db.execute(
                "SELECT step, seq, fingerprint FROM steps WHERE sandbox=? AND step IS NOT NULL "
                "ORDER BY seq", (sandbox,)).fetchall()

    # ---- audit ----
    def audit(self, sandbox: str, kind: str, detail: str, count: int = 1) -> None:
        at = time.time()
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("INSERT INTO audit VALUES (?,?,?,?,?)",
                             (sandbox, at, kind, detail, count))
            self._db.execute(TOUCH, (sandbox, at, len(detail)))
            self._db.execute("COMMIT")

    def audit_records(self, sandbox: str) -> list[AuditRecord]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM audit WHERE sandbox=? ORDER BY at",
                                    (sandbox,)).fetchall()
        return [AuditRecord(sandbox_id=r[0], at=r[1], kind=r[2], detail=r[3], count=r[4])
                for r in rows]

    # ---- retention ----
    def ended(self, sandbox: str, at: float | None = None) -> None:
        """The sandbox stopped: its log's grace period starts now."""
        with self._lock:
            self._db.execute("UPDATE logs SET ended_at=? WHERE sandbox=?",
                             (time.time() if at is None else at, sandbox))

    def summaries(self) -> list[LogSummary]:
        with self._lock:
            rows = self._db.execute("SELECT sandbox, last_at, ended_at, bytes FROM logs")
            return [LogSummary(*r) for r in rows.fetchall()]

    def delete(self, sandbox: str) -> None:
        """Remove a sandbox's entries and audit records (retention only)."""
        with self._lock:
            self._next.pop(sandbox, None)
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute("UPDATE logs SET pruning=1 WHERE sandbox=?", (sandbox,))
                self._db.execute("DELETE FROM steps WHERE sandbox=?", (sandbox,))
                self._db.execute("DELETE FROM audit WHERE sandbox=?", (sandbox,))
                self._db.execute("DELETE FROM logs WHERE sandbox=?", (sandbox,))
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def prune(self, policy: TrajectoryRetention, is_live: Callable[[str], bool],
              now: float | None = None) -> PruneReport:
        """Delete the logs ``policy`` lets go and give their space back to the disk.

        ``is_live(sandbox)``: whether the sandbox still runs; asked again right before each
        delete, so a pass never removes the log of a sandbox that runs."""
        report = PruneReport(bytes_before=self.file_bytes())
        logs = self.summaries()
        live = {s.sandbox for s in logs if is_live(s.sandbox)}
        used = (self._pragma("page_count") - self._pragma("freelist_count")) \
            * self._pragma("page_size")
        for sandbox in plan_prune(logs, live, time.time() if now is None else now, policy,
                                  used):
            if not is_live(sandbox):
                self.delete(sandbox)
                report.pruned.append(sandbox)
        if report.pruned or self._pragma("freelist_count"):
            self.reclaim()
        report.bytes_after = self.file_bytes()
        return report

    def reclaim(self) -> None:
        """Hand free pages back to the file system and empty the WAL."""
        if self._pragma("auto_vacuum") != 2:
            self._incremental()
        while self._pragma("freelist_count"):
            with self._lock:
                self._db.execute(f"PRAGMA incremental_vacuum({VACUUM_STEP})").fetchall()
        with self._lock:
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

    def file_bytes(self) -> int:
        """Bytes the log takes on disk: the database file and its WAL."""
        total = 0
        for p in (self.path, self.path.with_name(self.path.name + "-wal")):
            try:
                total += os.stat(p).st_size
            except FileNotFoundError:
                pass
        return total

    def _incremental(self) -> None:
        # auto_vacuum can change only by rebuilding the file: once, on a log made before
        # retention (after a pass has deleted, so the copy is small) or a new one.
        with self._lock:
            self._db.execute("PRAGMA auto_vacuum=INCREMENTAL")
            self._db.execute("VACUUM")

    def _pragma(self, name: str) -> int:
        with self._lock:
            return self._db.execute(f"PRAGMA {name}").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _entry(r: tuple) -> TrajectoryEntry:
    return TrajectoryEntry(sandbox_id=r[0], seq=r[1], step=r[2], kind=r[3], fingerprint=r[4],
                           request=json.loads(r[5]), result=json.loads(r[6]), at=r[7])
