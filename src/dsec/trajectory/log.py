"""The trajectory log: per sandbox, every mutating call and its result, in order, durably.

One SQLite file per node (``trajectory.db``, apart from ``node.db`` so a long log never
slows the sandbox table). Rows are append-only: triggers refuse UPDATE and DELETE on steps.
WAL with ``synchronous=NORMAL`` keeps an append across a SIGKILL of the node; a host crash
can lose the last ones, and takes the sandboxes with it.
The same file holds the audit records of denied actions.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from dsec.api.rl import AuditRecord, TrajectoryEntry
from dsec.node.store import open_db

__all__ = ["TrajectoryLog"]

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
CREATE TRIGGER IF NOT EXISTS steps_no_delete BEFORE DELETE ON steps
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


class TrajectoryLog:
    """Append and read trajectories; thread-safe."""

    def __init__(self, path: Path) -> None:
        self._db = open_db(path, SCHEMA)
        self._lock = threading.Lock()

    def append(self, sandbox: str, step: str | None, kind: str, fingerprint: str,
               request: dict, result: dict) -> TrajectoryEntry:
        """Add one entry at the end of ``sandbox``'s log and return it."""
        at = time.time()
        req, res = json.dumps(request), json.dumps(result)
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                (seq,) = self._db.execute(
                    "SELECT COALESCE(MAX(seq) + 1, 0) FROM steps WHERE sandbox=?",
                    (sandbox,)).fetchone()
                self._db.execute("INSERT INTO steps VALUES (?,?,?,?,?,?,?,?)",
                                 (sandbox, seq, step, kind, fingerprint, req, res, at))
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        return TrajectoryEntry(sandbox_id=sandbox, seq=seq, step=step, kind=kind,
                               fingerprint=fingerprint, request=request, result=result, at=at)

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
        with self._lock:
            self._db.execute("INSERT INTO audit VALUES (?,?,?,?,?)",
                             (sandbox, time.time(), kind, detail, count))

    def audit_records(self, sandbox: str) -> list[AuditRecord]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM audit WHERE sandbox=? ORDER BY at",
                                    (sandbox,)).fetchall()
        return [AuditRecord(sandbox_id=r[0], at=r[1], kind=r[2], detail=r[3], count=r[4])
                for r in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _entry(r: tuple) -> TrajectoryEntry:
    return TrajectoryEntry(sandbox_id=r[0], seq=r[1], step=r[2], kind=r[3], fingerprint=r[4],
                           request=json.loads(r[5]), result=json.loads(r[6]), at=r[7])
