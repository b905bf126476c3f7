"""What the gateway needs from a cluster: node clients, and the one that owns an id."""

from __future__ import annotations

from typing import Protocol

from dsec.cluster.nodeclient import NodeClient

__all__ = ["Cluster", "node_short_of"]


def node_short_of(sb_id: str) -> str:
    """``sb-<node>-<rand>`` names its node; anything else names none."""
    parts = sb_id.split("-")
    return parts[1] if len(parts) == 3 and parts[0] == "sb" else ""


class Cluster(Protocol):
    """The nodes one gateway serves: one in-process node, or the node agents of Ray."""

    def clients(self) -> list[NodeClient]:
        """Every node this gateway knows, healthy or not (the watcher tells which)."""

    def client_for(self, sb_id: str) -> NodeClient:
        """The node named in ``sb_id``; NotFound when no known node has that name."""

    def image_store(self):
        """The layer store the blob routes serve, or None (a gateway of many nodes)."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...
