"""The control store's SQLite file: one schema, one connection per gateway process.

Several gateways on one machine open the same file (WAL): every change that must not
race (a quota grant, an admission) is one ``BEGIN IMMEDIATE`` transaction, so two
gateways cannot both take the last sandbox of a quota.

Its WAL is checkpointed off the event loop (:mod:`dsec.wal`).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dsec.wal import tune

__all__ = ["open_control_db", "write"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS projects (
    id TEXT PRIMARY KEY, path TEXT UNIQUE NOT NULL, created_at REAL NOT NULL,
    sandboxes INTEGER, cpu REAL, memory_mb INTEGER, creations_per_s REAL);
CREATE TABLE IF NOT EXISTS tokens (
    id TEXT PRIMARY KEY, hash BLOB UNIQUE NOT NULL, project_id TEXT NOT NULL,
    role TEXT NOT NULL, name TEXT NOT NULL DEFAULT '', created_at REAL NOT NULL,
    expires_at REAL, revoked_at REAL, created_by TEXT);
CREATE INDEX IF NOT EXISTS tokens_project ON tokens(project_id);
-- usage rolled up: a project's row counts it and everything below it
CREATE TABLE IF NOT EXISTS usage (
    path TEXT PRIMARY KEY, sandboxes INTEGER NOT NULL DEFAULT 0,
    cpu REAL NOT NULL DEFAULT 0, memory_mb INTEGER NOT NULL DEFAULT 0,
    bucket REAL, bucket_at REAL);
-- one row per sandbox a project holds, from admission (sb_id NULL while being created)
CREATE TABLE IF NOT EXISTS held (
    key TEXT PRIMARY KEY, path TEXT NOT NULL, cpu REAL NOT NULL, memory_mb INTEGER NOT NULL,
    node TEXT, sb_id TEXT UNIQUE, at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS held_node ON held(node);
-- the one line of every gateway sharing the store: a row per create waiting for room,
-- keyed by its arrival (ns since the epoch, on its gateway's clock) and its gateway
CREATE TABLE IF NOT EXISTS line (
    gateway TEXT NOT NULL, at INTEGER NOT NULL, path TEXT NOT NULL,
    PRIMARY KEY (gateway, at)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS line_path ON line(path, at);
-- each gateway with a row in line says it is alive here (seen: time.time()); the rows of
-- one not seen for a lease are a crashed gateway's, and no longer hold anyone up
CREATE TABLE IF NOT EXISTS gateways (id TEXT PRIMARY KEY, seen REAL NOT NULL);
CREATE TABLE IF NOT EXISTS audit (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, path TEXT NOT NULL,
    who TEXT NOT NULL, action TEXT NOT NULL, target TEXT NOT NULL, outcome TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS audit_path ON audit(path, seq);
-- 'gen' goes up with every change of a project or a token's revocation: each gateway
-- keeps what it read of them (principals, quotas) while gen stays what it was
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO meta (key, value) VALUES ('gen', 0);
"""


def open_control_db(path: Path | str) -> sqlite3.Connection:
    """The store at ``path`` (``":memory:"`` for a gateway of its own), schema applied."""
    if str(path) != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        # tokens' hashes and the audit log: private, like the rest of the state dir
        # (SQLite gives its -wal and -shm files the mode of the database file)
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False,
                           timeout=10.0)
    conn.execute("PRAGMA busy_timeout = 10000")
    if str(path) != ":memory:":
        tune(conn)
    conn.executescript(SCHEMA)
    _add_columns(conn)
    return conn


# columns added since the first schema: (table, column, type); a store made before them
# gets them here (NULL in the rows it had)
_ADDED = (("tokens", "created_by", "TEXT"),)


def _add_columns(conn: sqlite3.Connection) -> None:
    for table, column, kind in _ADDED:
        have = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
        if column not in have:
            try:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
            except sqlite3.OperationalError as exc:  # another gateway added it just now
                if "duplicate column" not in str(exc):
                    raise


@contextmanager
def write(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction, taken at once (``BEGIN IMMEDIATE``): it sees no other
    gateway's half-done change and none can interleave with it."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
