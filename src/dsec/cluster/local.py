"""The embedded cluster: one node agent in the gateway's own process."""

from __future__ import annotations

from dsec.api.errors import NotFound
from dsec.cluster.base import node_short_of
from dsec.node.config import NodeConfig
from dsec.node.service import NodeService

__all__ = ["LocalCluster"]


class LocalCluster:
    def __init__(self, node: NodeService) -> None:
        self.node = node

    @classmethod
    async def open(cls, config: NodeConfig) -> LocalCluster:
        return cls(await NodeService.open(config))

    def nodes(self) -> list[NodeService]:
        return [self.node]

    def node_for(self, sb_id: str) -> NodeService:
        if node_short_of(sb_id) != self.node.short:
            raise NotFound(f"sandbox {sb_id} not found")
        return self.node

    async def close(self) -> None:
        await self.node.close()
