"""Node-local durable state: one SQLite row per sandbox.

The node agent is the only writer. WAL mode and ``synchronous=NORMAL`` make a write survive
a SIGKILL of the process (the data is in the WAL); only a host crash can lose the last
transactions, and a host crash takes the sandboxes with it anyway.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from pydantic import ValidationError

from dsec.api.models import SandboxSpec
from dsec.node.backends.base import SandboxRecord
from dsec.wal import open_db

__all__ = ["NodeStore", "ensure_node_id"]


SCHEMA = """
CREATE TABLE IF NOT EXISTS sandboxes (
    id TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    state TEXT NOT NULL,
    created_at REAL NOT NULL,
    last_active_at REAL NOT NULL,
    expires_at REAL,
    runtime TEXT NOT NULL DEFAULT '{}',
    error TEXT
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class NodeStore:
    """Sandboxes of this node, by id; thread-safe."""

    def __init__(self, path: Path) -> None:
        self._db = open_db(path, SCHEMA)
        self._lock = threading.Lock()

    def put(self, rec: SandboxRecord) -> None:
        row = (rec.id, rec.spec.model_dump_json(), rec.state, rec.created_at,
               rec.last_active_at, rec.expires_at, json.dumps(rec.runtime), rec.error)
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO sandboxes VALUES (?,?,?,?,?,?,?,?)", row)

    def delete(self, sb_id: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM sandboxes WHERE id=?", (sb_id,))

    def all(self) -> list[SandboxRecord]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM sandboxes ORDER BY created_at").fetchall()
        return [SandboxRecord(id=r[0], spec=_saved_spec(r[1]), state=r[2],
                              created_at=r[3], last_active_at=r[4], expires_at=r[5],
                              runtime=json.loads(r[6]), error=r[7]) for r in rows]

    def meta(self, key: str, default: str | None = None) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else default

    def set_meta(self, key: str, value: str) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO meta VALUES (?,?)", (key, value))

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _saved_spec(raw: str) -> SandboxSpec:
    """A sandbox's spec as saved: validated as a request is, else taken as it was. A rule
    tightened since the sandbox was made (a lower limit, a bound like ttl_s's) must not
    cost a node that restarts its running sandbox, nor the node its start."""
    try:
        return SandboxSpec.model_validate_json(raw)
    except ValidationError:
        return SandboxSpec.model_construct(**json.loads(raw))


def ensure_node_id(db_path: Path) -> str:
    """The node id kept in a node's store, created on first use (``node-<8 hex>``)."""
    import secrets
    store = NodeStore(db_path)
    try:
        node_id = store.meta("node_id")
        if node_id is None:
            node_id = f"node-{secrets.token_hex(4)}"
            store.set_meta("node_id", node_id)
        return node_id
    finally:
        store.close()
