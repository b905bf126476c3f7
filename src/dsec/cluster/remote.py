"""What every cluster of remote nodes shares: an HttpNodeClient per node, found in the
background by a subclass's :meth:`RemoteNodes.discover`, never per request.

A node once known stays known: when it stops answering, the watcher marks it unhealthy
and its sandboxes answer NodeLost, instead of being forgotten and answering NotFound.
"""

from __future__ import annotations

import asyncio
import logging

from dsec.api.errors import NotFound, shorten
from dsec.cluster.base import node_short_of
from dsec.cluster.http import HttpNodeClient

__all__ = ["RemoteNodes"]

log = logging.getLogger("dsec.cluster")


class RemoteNodes:
    """Node clients by short id; ``discover`` (a subclass's) runs every ``refresh_s``."""

    def __init__(self, token: str, refresh_s: float = 5.0) -> None:
        self.token, self.refresh_s = token, refresh_s
        self._clients: dict[str, HttpNodeClient] = {}
        self._task: asyncio.Task | None = None

    async def discover(self) -> None:
        raise NotImplementedError

    def discovering(self) -> bool:
        """Whether to keep looking for nodes after this pass."""
        return True

    async def start(self) -> None:
        await self.discover()
        self._task = asyncio.create_task(self._loop(), name=f"dsec-{type(self).__name__}")

    async def _loop(self) -> None:
        while self.discovering():
            await asyncio.sleep(self.refresh_s)
            try:
                await self.discover()
            except Exception:  # noqa: BLE001 - one bad pass must not end discovery
                log.exception("looking for node agents failed")

    def clients(self) -> list[HttpNodeClient]:
        return list(self._clients.values())

    def client_for(self, sb_id: str) -> HttpNodeClient:
        client = self._clients.get(node_short_of(sb_id))
        if client is None:
            raise NotFound(f"sandbox {shorten(sb_id)} not found (no node of this cluster is "
                           f"named {shorten(node_short_of(sb_id) or 'in that id')})")
        return client

    def image_store(self):
        return None  # many nodes, many stores: the blob routes are a node's own

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for c in self._clients.values():
            await c.close()
