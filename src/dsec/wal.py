"""SQLite files in WAL mode whose checkpoints never run on an event loop.

Every SQLite file of a server (the node's ``node.db`` and ``trajectory.db``, the
gateway's ``projects.db``) is written from its event loop: a commit appends to the WAL
and no more (``synchronous = NORMAL``: it survives a SIGKILL of the process; a host
crash can lose the last ones). The checkpoint, which copies the WAL into the database
and fsyncs both, is where a commit would wait on the disk. SQLite runs it inside
whichever commit fills ``wal_autocheckpoint`` pages: on the loop, tens to hundreds of ms
that every request of the process waits out (an exec load of 400/s over one node: the
trajectory log's commits checkpointed every few seconds and held the loop 0.1-0.16 s).

So a connection opened by :func:`tune` checkpoints itself only as a backstop
(:data:`BACKSTOP_PAGES`), and :class:`Checkpointer` does it on a worker thread with a
connection of its own, every :data:`CHECKPOINT_S` (:func:`checkpoint_forever`). A
PASSIVE checkpoint never blocks a writer, and SQLite lets go of the GIL while it waits
on the disk. What a commit promises does not change; at low rates the timer makes the
WAL reach the database sooner than the page count would have.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import threading
from pathlib import Path

__all__ = ["open_db", "tune", "Checkpointer", "checkpoint_forever", "CHECKPOINT_S",
           "BACKSTOP_PAGES", "WAL_KEPT_BYTES"]

CHECKPOINT_S = 0.5       # how often a checkpointer runs (when anything was committed)
BACKSTOP_PAGES = 20_000  # a connection checkpoints itself only if the WAL grew this big
WAL_KEPT_BYTES = 4 << 20  # a WAL a burst grew past this is cut back once checkpointed

log = logging.getLogger("dsec.wal")


def tune(conn: sqlite3.Connection) -> sqlite3.Connection:
    """WAL, commits that write only the WAL, checkpoints left to a :class:`Checkpointer`."""
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")  # WAL: durable at checkpoints, never torn
    conn.execute(f"PRAGMA wal_autocheckpoint = {BACKSTOP_PAGES}")
    conn.execute(f"PRAGMA journal_size_limit = {WAL_KEPT_BYTES}")
    return conn


def open_db(path: Path, schema: str) -> sqlite3.Connection:
    """An autocommit connection to ``path`` (made private), :func:`tune`\\ d, with
    ``schema`` applied; shareable across threads (callers serialize with a lock)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # Private from the start: SQLite gives the -wal and -shm files the database's mode.
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        if p.exists():
            os.chmod(p, 0o600)
    db = tune(sqlite3.connect(str(path), check_same_thread=False, isolation_level=None))
    db.executescript(schema)
    return db


class Checkpointer:
    """PASSIVE checkpoints of the file at ``path`` on a connection of its own, meant to
    run on a worker thread (``asyncio.to_thread(cp.run)``)."""

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


async def checkpoint_forever(*checkpointers: Checkpointer) -> None:
    """Run each of ``checkpointers`` every :data:`CHECKPOINT_S` on a worker thread until
    cancelled (then close them)."""
    try:
        while True:
            await asyncio.sleep(CHECKPOINT_S)
            for cp in checkpointers:
                try:
                    await asyncio.to_thread(cp.run)
                except Exception:  # a busy or failing disk this round; the backstop remains
                    log.exception("checkpointing %s failed", cp.path)
    finally:
        for cp in checkpointers:
            cp.close()
