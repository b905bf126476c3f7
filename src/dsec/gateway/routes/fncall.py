"""Stateless calls on the fncall backend: ``POST /v1/fncall`` and ``/v1/fncall/batch``."""

from __future__ import annotations

from fastapi import APIRouter, Request

from dsec.api.errors import Capacity
from dsec.api.fncall import FnCallBatch, FnCallBatchResult, FnCallRequest, FnCallResult
from dsec.gateway import metrics
from dsec.gateway.routes.common import gateway_of

__all__ = ["router"]

router = APIRouter(prefix="/v1")

FNCALL_CPU = 0.05  # what a call reserves while it runs, as placement counts it


async def _placed(request: Request, memory_mb: int, count: int, call):
    """Run ``call(node)`` on the node placement picks; on a refusal, the next one."""
    gw = gateway_of(request)
    tried: list[str] = []
    while True:
        client = gw.placer.choose("fncall", memory_mb, FNCALL_CPU, count, exclude=tried)
        try:
            return await call(client)
        except Capacity:
            tried.append(client.node_id)
            metrics.RETRIES.labels("refused").inc()
            if len(tried) >= len(gw.cluster.clients()):
                raise


@router.post("/fncall", response_model=FnCallResult)
async def fncall(request: Request, req: FnCallRequest) -> FnCallResult:
    return await _placed(request, req.memory_mb, 1, lambda c: c.fncall(req))


@router.post("/fncall/batch", response_model=FnCallBatchResult)
async def fncall_batch(request: Request, batch: FnCallBatch) -> FnCallBatchResult:
    top = max(c.memory_mb for c in batch.calls)
    results = await _placed(request, top, len(batch.calls),
                            lambda c: c.fncall_many(batch.calls))
    return FnCallBatchResult(results=results)
