"""What the gateway needs from a cluster: the nodes, and the node that owns an id."""

from __future__ import annotations

from typing import Protocol

from dsec.node.service import NodeService

__all__ = ["Cluster", "node_short_of"]


def node_short_of(sb_id: str) -> str:
    """``sb-<node>-<rand>`` names its node; anything else names none."""
    parts = sb_id.split("-")
    return parts[1] if len(parts) == 3 and parts[0] == "sb" else ""


class Cluster(Protocol):
    def nodes(self) -> list[NodeService]: ...

    def node_for(self, sb_id: str) -> NodeService: ...

    async def close(self) -> None: ...
