"""Helpers shared by the routers: find the cluster and the node owning a sandbox."""

from __future__ import annotations

from fastapi import Request

from dsec.cluster.base import Cluster
from dsec.node.service import NodeService

__all__ = ["cluster_of", "node_of"]


def cluster_of(request: Request) -> Cluster:
    return request.app.state.cluster


def node_of(request: Request, sb_id: str) -> NodeService:
    return cluster_of(request).node_for(sb_id)
