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
connection of its own (:func:`checkpoint_forever`): when, looked at every
:data:`CHECKPOINT_S`, the WAL holds :data:`DUE_FRAMES` frames not yet copied back (what
SQLite's own automatic checkpoint waits for), read off the wal-index header in the
``-shm`` file, one ``pread`` on the loop. A checkpoint on a timer alone would fsync
every active file twice a second: nothing for a node's two files, but 640 fsyncs a second
from 160 simulated nodes on one machine, which slowed every commit on it. A PASSIVE
checkpoint never blocks a writer, and SQLite lets go of the GIL while it waits on the
disk. What a commit promises does not change.

The WAL starts over from its beginning (and stops growing) only at a commit that finds
every frame copied back. Commits that land while a checkpoint runs leave it a few frames
short, so under a steady stream of commits one pass per checkpoint never let it start over:
it grew until the backstop checkpointed it inside a commit, on the loop, and cut 80 MB of
it back there (an ``ftruncate`` freeing its page cache: 12-25 ms every 6 s under 800
execs/s, most of the exec p99). A checkpoint therefore makes up to :data:`CHASE` passes,
each copying only what came during the last, until nothing is left. A WAL is cut back to
:data:`WAL_KEPT_BYTES` when it starts over, so one a burst grew does not keep its size.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import struct
import threading
from pathlib import Path

__all__ = ["open_db", "tune", "Checkpointer", "checkpoint_forever", "CHECKPOINT_S",
           "DUE_FRAMES", "BACKSTOP_PAGES", "CHASE", "WAL_KEPT_BYTES"]
# the wal-index header (https://www.sqlite.org/walformat.html), in the host's byte order:
# mxFrame, the WAL's last valid frame, at 16; nBackfill, frames copied back, at 96
_MX_FRAME, _BACKFILL = struct.Struct("=I"), 96

CHECKPOINT_S = 0.5       # how often a checkpointer looks at the WAL
DUE_FRAMES = 1000        # frames not yet copied back that make a checkpoint due
BACKSTOP_PAGES = 20_000  # a connection checkpoints itself only if the WAL grew this big
CHASE = 8               # passes one checkpoint makes to catch up with the commits
WAL_KEPT_BYTES = 16 << 20  # a WAL a burst grew past this is cut back once checkpointed

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

    def pending(self) -> int:
        """Frames in the WAL not yet copied back into the database (0 with no WAL)."""
        try:
            fd = os.open(self.path + "-shm", os.O_RDONLY)
        except FileNotFoundError:
            return 0
        try:
            head = os.pread(fd, _BACKFILL + 4, 0)
        finally:
            os.close(fd)
        if len(head) < _BACKFILL + 4:
            return 0
        mx = _MX_FRAME.unpack_from(head, 16)[0]
        return max(0, mx - _MX_FRAME.unpack_from(head, _BACKFILL)[0])

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
        for _ in range(CHASE):  # until the next commit can start the WAL over (see above)
            self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            if self.pending() == 0:
                break
        return True

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None


async def checkpoint_forever(*checkpointers: Checkpointer) -> None:
    """Every :data:`CHECKPOINT_S`, run each of ``checkpointers`` whose WAL holds
    :data:`DUE_FRAMES` frames not copied back, on a worker thread; until cancelled (then
    close them)."""
    try:
        while True:
            await asyncio.sleep(CHECKPOINT_S)
            for cp in checkpointers:
                try:
                    if cp.pending() >= DUE_FRAMES:
                        await asyncio.to_thread(cp.run)
                except Exception:  # a busy or failing disk this round; the backstop remains
                    log.exception("checkpointing %s failed", cp.path)
    finally:
        for cp in checkpointers:
            cp.close()
