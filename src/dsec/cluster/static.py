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
import re

import httpx

from dsec.cluster.http import CONNECT_S, HttpNodeClient
from dsec.cluster.remote import RemoteNodes

__all__ = ["StaticCluster"]

log = logging.getLogger("dsec.cluster.static")
NODE_ID = re.compile(r"node-[0-9a-z]{1,32}")  # as a node names itself (node-<hex>)


class StaticCluster(RemoteNodes):
    """An :class:`HttpNodeClient` per URL of ``urls``; ``token`` is the cluster credential."""

    def __init__(self, urls: list[str], token: str, refresh_s: float = 5.0) -> None:
        super().__init__(token, refresh_s)
        self.urls = [u.rstrip("/") for u in urls]
        self._unknown = list(self.urls)
        self._why: dict[str, str] = {}  # why each unknown URL is not served, as last logged

    async def discover(self) -> None:
        """Ask each URL not known yet which node answers there. A URL that answers
        something else than one node's load (a wrong credential, a page, a node id
        another URL has) is left unknown and logged with why; the others are served."""
        async with httpx.AsyncClient(headers={"authorization": f"Bearer {self.token}"},
                                     timeout=httpx.Timeout(5.0, connect=CONNECT_S)) as http:
            got = await asyncio.gather(*(_node_id(http, u) for u in self._unknown),
                                       return_exceptions=True)
        still, why = [], {}
        for url, node_id in zip(self._unknown, got):
            if isinstance(node_id, BaseException):
                still.append(url)
                why[url] = _why(node_id)
                continue
            client = HttpNodeClient(node_id, url, self.token)
            if (known := self._clients.get(client.short)) is not None:
                await client.close()
                still.append(url)
                why[url] = f"it says it is {node_id}, which {known.url} is"
                continue
            self._clients[client.short] = client
        if why != self._why:  # said once per change, not every refresh
            for url in still:
                log.warning("node URL %s is not served yet: %s", url, why[url])
        self._unknown, self._why = still, why
    def discovering(self) -> bool:
        return bool(self._unknown)


async def _node_id(http: httpx.AsyncClient, url: str) -> str:
    resp = await http.get(f"{url}/v1/nodes/load")
    if resp.status_code == 401:
        raise PermissionError("it refuses this gateway's cluster credential (401): give both "
                              "the same cluster_token")
    resp.raise_for_status()
    loads = resp.json()
    if not isinstance(loads, list) or len(loads) != 1 or not isinstance(loads[0], dict):
        raise ValueError("it does not answer as one node's API (GET /v1/nodes/load)")
    node_id = loads[0].get("node_id")
    if not isinstance(node_id, str) or not NODE_ID.fullmatch(node_id):
        raise ValueError(f"it names itself {str(node_id)[:80]!r}, not a node id")
    return node_id


def _why(exc: BaseException) -> str:
    if isinstance(exc, httpx.TransportError):
        return f"no answer yet ({type(exc).__name__})"
    return f"{type(exc).__name__}: {str(exc)[:200]}"
