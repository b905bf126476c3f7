"""Network policy routes: read and change a running sandbox's egress permissions."""

from __future__ import annotations

from fastapi import APIRouter, Request

from dsec.api.rl import NetworkRequest, NetworkStatus
from dsec.gateway.routes.common import client_for

__all__ = ["router"]

router = APIRouter(prefix="/v1/sandboxes/{sb_id}/network")


@router.get("", response_model=NetworkStatus)
async def get_network(request: Request, sb_id: str) -> NetworkStatus:
    return await client_for(request, sb_id).network(sb_id)


@router.put("", response_model=NetworkStatus)
async def put_network(request: Request, sb_id: str, req: NetworkRequest) -> NetworkStatus:
    return await client_for(request, sb_id).set_network(sb_id, req.allow)
