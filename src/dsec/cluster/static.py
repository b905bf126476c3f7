"""A gateway over a fixed list of node agents' URLs, with no discovery service.

Each URL is one node agent's own API (the gateway app over that node's
:class:`~dsec.cluster.local.LocalCluster`, as a Ray node actor or
:mod:`dsec.cluster.simulated` serves it). The node's id is asked once from its URL; a URL
that does not answer yet is asked again every ``refresh_s`` in the background. A node once
known stays known: when it stops answering the watcher marks it and its sandboxes answer
NodeLost, rather than NotFound.
"""

from __future__ import annotations

import asyncio
import logging

import httpx

from dsec.api.errors import NotFound
from dsec.cluster.base import node_short_of
from dsec.cluster.http import CONNECT_S, HttpNodeClient

__all__ = ["StaticCluster"]

log = logging.getLogger("dsec.cluster.static")


class StaticCluster:
    """An :class:`HttpNodeClient` per URL of ``urls``; ``token`` is the cluster credential."""

    def __init__(self, urls: list[str], token: str, refresh_s: float = 5.0) -> None:
        self.urls = [u.rstrip("/") for u in urls]
        self.token, self.refresh_s = token, refresh_s
        self._clients: dict[str, HttpNodeClient] = {}  # short -> client
        self._unknown = list(self.urls)
        self._task: asyncio.Task | None = None

    async def discover(self) -> None:
        """Ask each URL not known yet which node answers there."""
        async with httpx.AsyncClient(headers={"authorization": f"Bearer {self.token}"},
                                     timeout=httpx.Timeout(5.0, connect=CONNECT_S)) as http:
            got = await asyncio.gather(*(_node_id(http, u) for u in self._unknown),
                                       return_exceptions=True)
        still = []
        for url, node_id in zip(self._unknown, got):
            if isinstance(node_id, BaseException):
                still.append(url)
                continue
            client = HttpNodeClient(node_id, url, self.token)
            if client.short in self._clients:
                await client.close()
                raise ValueError(f"{url} and {self._clients[client.short].url} are the "
                                 f"same node {node_id}")
            self._clients[client.short] = client
        if still and len(still) != len(self._unknown):
            log.warning("%d node URL(s) do not answer yet: %s", len(still), ", ".join(still[:4]))
        self._unknown = still

    async def start(self) -> None:
        await self.discover()
        self._task = asyncio.create_task(self._loop(), name="dsec-static-discovery")

    async def _loop(self) -> None:
        while self._unknown:
            await asyncio.sleep(self.refresh_s)
            try:
                await self.discover()
            except Exception:  # noqa: BLE001 - one bad URL must not end discovery
                log.exception("asking node URLs for their ids failed")

    def clients(self) -> list[HttpNodeClient]:
        return list(self._clients.values())

    def client_for(self, sb_id: str) -> HttpNodeClient:
        client = self._clients.get(node_short_of(sb_id))
        if client is None:
            raise NotFound(f"sandbox {sb_id} not found (no node of this cluster is named "
                           f"{node_short_of(sb_id) or 'in that id'})")
        return client

    def image_store(self):
        return None

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for c in self._clients.values():
            await c.close()


async def _node_id(http: httpx.AsyncClient, url: str) -> str:
    resp = await http.get(f"{url}/v1/nodes/load")
    resp.raise_for_status()
    loads = resp.json()
    if len(loads) != 1:
        raise ValueError(f"{url} answers for {len(loads)} nodes; it must be one node's API")
    return loads[0]["node_id"]
