"""The control store's SQLite file: one schema, one connection per gateway process.

Several gateways on one machine open the same file (WAL): every change that must not
race (a quota grant, an admission) is one ``BEGIN IMMEDIATE`` transaction, so two
gateways cannot both take the last sandbox of a quota.

A commit writes the WAL and no more (``synchronous = NORMAL``); the checkpoint, which
copies the WAL into the database and fsyncs both, is where a commit would wait on the
disk. SQLite runs it inside whichever commit fills ``wal_autocheckpoint`` pages: on the
gateway's event loop, every few hundred creates, tens of ms that every request of the
gateway waits out. So the gateway's connection checkpoints only as a backstop
(:data:`BACKSTOP_PAGES`), and :class:`Checkpointer` does it off the loop, on a thread
with a connection of its own, every :data:`CHECKPOINT_S` (a PASSIVE checkpoint: it
never blocks a writer). What a commit promises does not change; at low rates the
timer makes the WAL reach the disk sooner than the page count would have.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["open_control_db", "write", "Checkpointer", "CHECKPOINT_S", "BACKSTOP_PAGES"]

CHECKPOINT_S = 0.5       # how often the checkpointer runs (when anything was committed)
BACKSTOP_PAGES = 20_000  # a connection checkpoints itself only if the WAL grew this big

SCHEMA = """
CREATE TABLE IF NOT EXISTS projects (
    id TEXT PRIMARY KEY, path TEXT UNIQUE NOT NULL, created_at REAL NOT NULL,
    sandboxes INTEGER, cpu REAL, memory_mb INTEGER, creations_per_s REAL);
CREATE TABLE IF NOT EXISTS tokens (
    id TEXT PRIMARY KEY, hash BLOB UNIQUE NOT NULL, project_id TEXT NOT NULL,
    role TEXT NOT NULL, name TEXT NOT NULL DEFAULT '', created_at REAL NOT NULL,
    expires_at REAL, revoked_at REAL);
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
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")  # WAL: durable at checkpoints, never torn
        conn.execute(f"PRAGMA wal_autocheckpoint = {BACKSTOP_PAGES}")  # see Checkpointer
    conn.executescript(SCHEMA)
    return conn


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


class Checkpointer:
    """PASSIVE checkpoints of the store at ``path`` on a connection of its own, meant to
    run on a worker thread (``asyncio.to_thread(cp.run)``): the fsyncs stay off the
    event loop, and SQLite lets go of the GIL while it waits on them."""

    def __init__(self, path: Path | str) -> None:
        self.path = str(path)
        self._conn: sqlite3.Connection | None = None
        self._seen: int | None = None
        self._lock = threading.Lock()  # close() waits for a checkpoint under way
        self._closed = False

    def run(self) -> bool:
        """One checkpoint if anything was committed since the last; whether one ran."""
        with self._lock:
            return False if self._closed else self._run()

    def _run(self) -> bool:
        if self._conn is None:
            self._conn = sqlite3.connect(self.path, isolation_level=None,
                                         check_same_thread=False, timeout=10.0)
        version = self._conn.execute("PRAGMA data_version").fetchone()[0]
        if version == self._seen:
            return False
        self._seen = version
        self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        return True

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None
