"""Image routes that change the layer store (listing stays with the sandbox routes)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from dsec.gateway.routes.common import cluster_of

__all__ = ["router"]

router = APIRouter(prefix="/v1")


@router.delete("/images/{name:path}", status_code=204)
async def remove_image(request: Request, name: str) -> None:
    """Untag an image; its manifest and layers go unless another image or a sandbox keeps
    them."""
    await cluster_of(request).nodes()[0].remove_image(name)
