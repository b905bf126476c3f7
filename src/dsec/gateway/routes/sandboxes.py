"""Sandbox lifecycle, exec and shell routes."""

from __future__ import annotations

import random
from collections import Counter

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel

from dsec.api.errors import Capacity, InvalidArgument
from dsec.api.models import (CreateManyRequest, ExecRequest, ExecResult, ImageSummary,
                             InputRequest, NodeInfo, PackDiffRequest, SandboxInfo, SandboxList,
                             SandboxSpec, ShellInfo, ShellRunRequest)
from dsec.gateway.routes.common import cluster_of, node_of
from dsec.placement.choose import choose_node, refusal

__all__ = ["router", "CreateManyResponse"]

router = APIRouter(prefix="/v1")
_recent: Counter[str] = Counter()  # this gateway's recent placements, see placement.choose


class CreateManyResponse(BaseModel):
    sandboxes: list[SandboxInfo]
    errors: list[str]


def _place(request: Request, spec: SandboxSpec, count: int = 1):
    nodes = {n.node_id: n for n in cluster_of(request).nodes()}
    chosen = choose_node([n.load() for n in nodes.values()], spec.backend, spec.memory_mb * count,
                         spec.cpu * count, recent=_recent, rng=random.Random())
    if chosen is None:
        raise Capacity(refusal([n.load() for n in nodes.values()], spec.backend,
                               spec.memory_mb, spec.cpu, count))
    _recent[chosen.node_id] += count
    if len(_recent) > 1024:
        _recent.clear()
    return nodes[chosen.node_id]


@router.post("/sandboxes", response_model=SandboxInfo, status_code=201)
async def create(request: Request, spec: SandboxSpec) -> SandboxInfo:
    return await _place(request, spec).create(spec)


@router.post("/sandboxes/batch", response_model=CreateManyResponse, status_code=201)
async def create_many(request: Request, req: CreateManyRequest) -> CreateManyResponse:
    made, errors = await _place(request, req.spec, req.count).create_many(req.count, req.spec)
    return CreateManyResponse(sandboxes=made, errors=errors)


@router.get("/sandboxes", response_model=SandboxList)
async def list_sandboxes(request: Request, job: str | None = None,
                         label: list[str] = Query(default=[])) -> SandboxList:
    labels = {}
    for item in label:
        k, sep, v = item.partition("=")
        if not sep:
            raise InvalidArgument(f"label filter must be key=value; got {item!r}")
        labels[k] = v
    out = []
    for node in cluster_of(request).nodes():
        out.extend(await node.list(job=job, labels=labels))
    return SandboxList(sandboxes=out)


@router.get("/sandboxes/{sb_id}", response_model=SandboxInfo)
async def get(request: Request, sb_id: str) -> SandboxInfo:
    return await node_of(request, sb_id).get(sb_id)


@router.delete("/sandboxes/{sb_id}", status_code=204)
async def stop(request: Request, sb_id: str) -> None:
    await node_of(request, sb_id).stop(sb_id)


@router.post("/sandboxes/{sb_id}/pause", response_model=SandboxInfo)
async def pause(request: Request, sb_id: str) -> SandboxInfo:
    return await node_of(request, sb_id).pause(sb_id)


@router.post("/sandboxes/{sb_id}/resume", response_model=SandboxInfo)
async def resume(request: Request, sb_id: str) -> SandboxInfo:
    return await node_of(request, sb_id).resume(sb_id)


@router.post("/sandboxes/{sb_id}/exec", response_model=ExecResult)
async def exec_(request: Request, sb_id: str, req: ExecRequest) -> Response:
    result = await node_of(request, sb_id).exec(sb_id, req)
    return _result_response(result)


@router.post("/sandboxes/{sb_id}/shells", response_model=ShellInfo, status_code=201)
async def shell_open(request: Request, sb_id: str) -> ShellInfo:
    return await node_of(request, sb_id).shell_open(sb_id)


@router.post("/sandboxes/{sb_id}/shells/{sh_id}/run", response_model=ExecResult)
async def shell_run(request: Request, sb_id: str, sh_id: str,
                    req: ShellRunRequest) -> Response:
    return _result_response(await node_of(request, sb_id).shell_run(sb_id, sh_id, req))


def _result_response(result: ExecResult) -> Response:
    # The hottest routes, and output of many MiB: serialised once, straight to bytes (no
    # str copy to encode again), skipping FastAPI's re-validation of the model.
    return Response(ExecResult.__pydantic_serializer__.to_json(result),
                    media_type="application/json")


@router.delete("/sandboxes/{sb_id}/shells/{sh_id}", status_code=204)
async def shell_close(request: Request, sb_id: str, sh_id: str) -> None:
    await node_of(request, sb_id).shell_close(sb_id, sh_id)


@router.post("/sandboxes/{sb_id}/pack_diff", response_model=ImageSummary)
async def pack_diff(request: Request, sb_id: str, req: PackDiffRequest) -> ImageSummary:
    return await node_of(request, sb_id).pack_diff(sb_id, req)


@router.get("/sandboxes/{sb_id}/screenshot", response_class=Response,
            responses={200: {"content": {"image/png": {}}}})
async def screenshot(request: Request, sb_id: str) -> Response:
    """The sandbox's display as PNG (``backend="vm"``; others answer Unsupported)."""
    return Response(await node_of(request, sb_id).screenshot(sb_id), media_type="image/png")


@router.post("/sandboxes/{sb_id}/input", status_code=204)
async def input_(request: Request, sb_id: str, req: InputRequest) -> None:
    """Type text, press keys or click (``backend="vm"``)."""
    await node_of(request, sb_id).input(sb_id, req)


@router.get("/images", response_model=list[ImageSummary])
async def images(request: Request) -> list[ImageSummary]:
    return await cluster_of(request).nodes()[0].list_images()


@router.get("/nodes", response_model=list[NodeInfo])
async def nodes(request: Request) -> list[NodeInfo]:
    return [await n.node_info() for n in cluster_of(request).nodes()]
