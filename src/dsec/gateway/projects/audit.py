"""The audit log: every management call and every refused request, per project.

Written by the gateway's auth layer (refusals) and the project routes (management); read
by an admin of the project or one above it (``GET /v1/projects/audit``). Bounded:
``keep`` entries in all, the oldest dropped first.
"""

from __future__ import annotations

import sqlite3
import time

from dsec.api.projects import AuditEntry

__all__ = ["AuditLog"]


class AuditLog:
    def __init__(self, conn: sqlite3.Connection, keep: int = 200_000) -> None:
        self.conn, self.keep = conn, keep
        self._writes = 0

    def record(self, path: str, who: str, action: str, target: str, outcome: str) -> None:
        """Append one entry (autocommit: it never waits behind an admission)."""
        self.conn.execute("INSERT INTO audit (at, path, who, action, target, outcome) "
                          "VALUES (?, ?, ?, ?, ?, ?)",
                          (time.time(), path, who, action[:200], target[:300], outcome[:500]))
        self._writes += 1
        if self._writes % 1000 == 0:
            self.conn.execute("DELETE FROM audit WHERE seq <= (SELECT max(seq) FROM audit) - ?",
                              (self.keep,))

    def entries(self, scope: str, limit: int = 100, since: float = 0.0) -> list[AuditEntry]:
        """Newest first: entries of ``scope`` and the projects below it."""
        if scope == "":
            rows = self.conn.execute(
                "SELECT at, path, who, action, target, outcome FROM audit WHERE at >= ? "
                "ORDER BY seq DESC LIMIT ?", (since, limit)).fetchall()
        else:
            rows = self.conn.execute(
                "SELECT at, path, who, action, target, outcome FROM audit WHERE at >= ? AND "
                "(path = ? OR substr(path, 1, ?) = ?) ORDER BY seq DESC LIMIT ?",
                (since, scope, len(scope) + 1, scope + "/", limit)).fetchall()
        return [AuditEntry(at=r[0], project=r[1], who=r[2], action=r[3], target=r[4],
                           outcome=r[5]) for r in rows]
