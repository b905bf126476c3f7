"""Trajectory log and audit routes of a sandbox (readable after the sandbox stopped)."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request

from dsec.api.rl import SandboxAuditList, TrajectoryPage
from dsec.gateway.routes.common import client_for

__all__ = ["router"]

router = APIRouter(prefix="/v1/sandboxes/{sb_id}")


@router.get("/trajectory", response_model=TrajectoryPage)
async def trajectory(request: Request, sb_id: str,
                     offset: int = Query(0, ge=0, le=(1 << 63) - 1),  # SQLite's integers
                     limit: int = Query(1000, ge=1, le=100000)) -> TrajectoryPage:
    return await client_for(request, sb_id).trajectory(sb_id, offset, limit)


@router.get("/audit", response_model=SandboxAuditList)
async def audit(request: Request, sb_id: str) -> SandboxAuditList:
    return SandboxAuditList(records=await client_for(request, sb_id).audit(sb_id))
