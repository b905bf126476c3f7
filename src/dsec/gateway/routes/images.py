"""Image routes: the images the nodes know, and their removal."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request

from dsec.api.errors import NotFound
from dsec.api.models import ImageSummary
from dsec.gateway.routes.common import gateway_of
from dsec.gateway.spread import healthy_clients
from dsec.gateway.spread import list_images as list_images_everywhere

__all__ = ["router"]

router = APIRouter(prefix="/v1")


@router.get("/images", response_model=list[ImageSummary])
async def list_images(request: Request) -> list[ImageSummary]:
    return await list_images_everywhere(gateway_of(request))


@router.delete("/images/{name:path}", status_code=204)
async def remove_image(request: Request, name: str) -> None:
    """Untag an image on every node; its manifest and layers go unless another image or a
    sandbox keeps them. NotFound only when no node had it."""
    clients, _ = healthy_clients(gateway_of(request))
    got = await asyncio.gather(*(c.remove_image(name) for c in clients),
                               return_exceptions=True)
    misses = [r for r in got if isinstance(r, NotFound)]
    if clients and len(misses) == len(clients):
        raise misses[0]
    for r in got:
        if isinstance(r, BaseException) and not isinstance(r, NotFound):
            raise r
