"""Stateless calls on the fncall backend: ``POST /v1/fncall`` and ``/v1/fncall/batch``."""

from __future__ import annotations

import random
from collections import Counter

from fastapi import APIRouter, Request

from dsec.api.errors import Capacity
from dsec.api.fncall import FnCallBatch, FnCallBatchResult, FnCallRequest, FnCallResult
from dsec.gateway.routes.common import cluster_of
from dsec.placement.choose import choose_node, refusal

__all__ = ["router"]

router = APIRouter(prefix="/v1")
_recent: Counter[str] = Counter()


def _backend(request: Request, memory_mb: int, count: int = 1):
    """The fncall backend of the node placement picks for ``count`` calls."""
    nodes = {n.node_id: n for n in cluster_of(request).nodes()}
    chosen = choose_node([n.load() for n in nodes.values()], "fncall", memory_mb, 0.05,
                         recent=_recent, rng=random.Random())
    if chosen is None:
        raise Capacity(refusal([n.load() for n in nodes.values()], "fncall", memory_mb, 0.05))
    _recent[chosen.node_id] += count
    if len(_recent) > 1024:
        _recent.clear()
    return nodes[chosen.node_id].backends["fncall"]


@router.post("/fncall", response_model=FnCallResult)
async def fncall(request: Request, req: FnCallRequest) -> FnCallResult:
    return await _backend(request, req.memory_mb).call(req)


@router.post("/fncall/batch", response_model=FnCallBatchResult)
async def fncall_batch(request: Request, batch: FnCallBatch) -> FnCallBatchResult:
    top = max(c.memory_mb for c in batch.calls)
    backend = _backend(request, top, len(batch.calls))
    return FnCallBatchResult(results=await backend.call_many(batch.calls))
