"""Projects, quotas, scoped tokens, queued admission and the audit log of a gateway.

:class:`Projects` is what the gateway holds: the control store (one SQLite file that the
gateways of an installation share; see README "Decisions"), the ledger of what each
project holds, the admission queues and the audit log, and the loop that keeps the
ledger true to what the nodes hold.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from pathlib import Path

from dsec.api.errors import DSecError, Unauthorized
from dsec.gateway.projects.admission import Admission
from dsec.gateway.projects.audit import AuditLog
from dsec.gateway.projects.db import open_control_db
from dsec.gateway.projects.ledger import FLUSH_S, Ledger
from dsec.gateway.projects.store import Principal, ProjectStore, token_hash
from dsec.wal import Checkpointer, checkpoint_forever

__all__ = ["Projects", "Principal", "ROOT"]

log = logging.getLogger("dsec.gateway")
ROOT = Principal(who="root", project="", role="admin")


class Projects:
    """The project side of one gateway; ``root_token`` is the root project's admin."""

    def __init__(self, root_token: str, path: Path | str = ":memory:",
                 reconcile_s: float = 2.0) -> None:
        conn = open_control_db(path)
        self.conn = conn
        self.store = ProjectStore(conn)
        self.ledger = Ledger(conn)
        self.store.settle = self.ledger.flush
        self.audit = AuditLog(conn)
        self.admission = Admission(self.ledger, self.store.quotas)
        self._root = f"Bearer {root_token}".encode()
        self.reconcile_s = reconcile_s
        self._task: asyncio.Task | None = None
        self._flush_at: asyncio.TimerHandle | None = None
        # per node: (load minus rows) left after its last listing, and when what made
        # that difference may first be adopted (see reconcile)
        self._listed: dict[str, tuple[int, float]] = {}
        # the WAL's checkpoints (and their fsyncs) off the event loop; none in memory
        self.checkpointer = None if str(path) == ":memory:" else Checkpointer(path)
        self._checkpoints: asyncio.Task | None = None

    def authenticate(self, header: bytes) -> Principal:
        """The caller an ``Authorization`` header names; Unauthorized saying why not."""
        if hmac.compare_digest(header, self._root):
            return ROOT
        if not header.startswith(b"Bearer dsec_"):
            raise Unauthorized("missing or wrong bearer token")
        return self.store.principal(token_hash(header[7:].decode("latin-1")))

    def still_valid(self, who: Principal) -> bool:
        """Whether the caller's token still works (a long stream asks now and then)."""
        if who.token_hash is None:
            return True
        try:
            self.store.principal(who.token_hash)
        except DSecError:
            return False
        return True

    # ---- keeping the ledger true ----
    def start(self, gateway) -> None:
        self._task = asyncio.create_task(self._reconcile_forever(gateway))
        if self.checkpointer is not None:
            self._checkpoints = asyncio.create_task(checkpoint_forever(self.checkpointer))
        self.ledger.defer = self._flush_soon

    def _flush_soon(self) -> None:
        """Confirmations wait in memory: written with the next write, or FLUSH_S from now."""
        if self._flush_at is None:
            self._flush_at = asyncio.get_running_loop().call_later(FLUSH_S, self._flush)

    def _flush(self) -> None:
        self._flush_at = None
        try:
            self.ledger.flush()
        except Exception:  # kept in memory; the next write or flush writes them
            log.exception("writing confirmations to the project ledger failed")
            self._flush_soon()

    async def stop(self) -> None:
        for task in (self._task, self._checkpoints):
            if task is None:
                continue
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        if self._flush_at is not None:
            self._flush_at.cancel()
        self.ledger.defer = None
        self.ledger.flush()
        self.admission.close()
        if self.checkpointer is not None:
            self.checkpointer.close()
        self.conn.close()

    async def _reconcile_forever(self, gw) -> None:
        while True:
            await asyncio.sleep(self.reconcile_s)
            try:
                await self.reconcile(gw)
            except Exception:  # a bad round must not end the loop; the next one retries
                log.exception("reconciling the project ledger failed")

    async def reconcile(self, gw) -> None:
        """For each healthy node whose count differs from the ledger's, list it and fix
        the ledger's rows of it (sandboxes that ended on their own give their room back)."""
        freed = False
        for client in gw.cluster.clients():
            view = gw.watcher.view(client.node_id)
            if view is None or view.load is None or not gw.watcher.healthy(client.node_id):
                continue
            # only rows older than the load: creates since then are in the ledger and
            # not yet in the load, and would have every node listed every round under load
            held = self.ledger.held_on(client.node_id, view.load_at)
            # the probe's own count: a create's answer sets the load's to what the node
            # holds with that create, which the ledger confirms only after it
            off = view.probed - held
            if off == 0:
                self._listed.pop(client.node_id, None)
                continue
            # The last listing found sandboxes no row knows, too young to adopt. Until the
            # first may be adopted, a difference as large or larger means only more such
            # sandboxes (another gateway's creates): listing again would change nothing.
            # With another gateway creating, every node was listed every round (a list
            # of a node's sandboxes costs it ms). A smaller difference means something
            # ended: listed at once, its room given back. Decision: one of this gateway's
            # sandboxes that ends on its own while others are made on its node, in the
            # same round, gives its room back only when the node is next listed (at most
            # ADOPT_AFTER_S later).
            last_off, until = self._listed.get(client.node_id, (None, 0.0))
            if last_off is not None and off >= last_off and time.time() < until:
                continue
            listed_at = time.time()
            infos = await client.list()
            present = {i.id: (i.project, i.cpu, i.memory_mb, i.created_at) for i in infos}
            # a chunk per transaction, the loop serving requests between them: a node's
            # 32,000 ended sandboxes were 0.5 s of this loop in one go
            totals = [0, 0]
            for _ in self.ledger.reconcile_steps(client.node_id, present, listed_at, totals):
                await asyncio.sleep(0)
            due = self.ledger.adopt_due.pop(client.node_id, None)
            if due is None:
                self._listed.pop(client.node_id, None)
            else:
                self._listed[client.node_id] = (off - totals[1] + totals[0], due)
            freed = freed or totals[0] > 0
        if freed:
            self.admission.freed()
