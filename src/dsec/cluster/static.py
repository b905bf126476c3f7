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

from dsec.cluster.http import CONNECT_S, HttpNodeClient
from dsec.cluster.remote import RemoteNodes

__all__ = ["StaticCluster"]

log = logging.getLogger("dsec.cluster.static")


class StaticCluster(RemoteNodes):
    """An :class:`HttpNodeClient` per URL of ``urls``; ``token`` is the cluster credential."""

    def __init__(self, urls: list[str], token: str, refresh_s: float = 5.0) -> None:
        super().__init__(token, refresh_s)
        self.urls = [u.rstrip("/") for u in urls]
        self._unknown = list(self.urls)

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

    def discovering(self) -> bool:
        return bool(self._unknown)


async def _node_id(http: httpx.AsyncClient, url: str) -> str:
    resp = await http.get(f"{url}/v1/nodes/load")
    resp.raise_for_status()
    loads = resp.json()
    if len(loads) != 1:
        raise ValueError(f"{url} answers for {len(loads)} nodes; it must be one node's API")
    return loads[0]["node_id"]
