"""Sandbox lifecycle, exec and shell routes."""

from __future__ import annotations

import asyncio
import json

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from dsec.api.errors import DSecError, InvalidArgument
from dsec.api.models import (CreateManyRequest, CreateManyResponse, ExecRequest, ExecResult,
                             ImageSummary, InputRequest, NodeInfo, PackDiffRequest, SandboxInfo,
                             SandboxList, SandboxSpec, ShellInfo, ShellRunRequest)
from dsec.cluster.http import LOAD_HEADER, counts_header, load_to_wire
from dsec.gateway import admitted
from dsec.gateway.auth import principal_of
from dsec.gateway.fastlane import hot
from dsec.gateway.openapi import raw_answer
from dsec.gateway.routes.common import (check_grading, client_for, gateway_of, model_response,
                                        reaches_protected, while_valid)
from dsec.gateway.spread import (create_batch, healthy_clients, list_all, lost_node,
                                 tag_free_elsewhere)
from dsec.placement.admission import NodeLoad

__all__ = ["router", "CreateManyResponse"]

router = APIRouter(prefix="/v1")


@router.post("/sandboxes", response_model=SandboxInfo, status_code=201)
@hot
async def create(request: Request, spec: SandboxSpec) -> Response:
    """In the caller's project, within its quota (queued up to ``wait_s``), on the node
    placement picks; a node that refuses is skipped and the next choice tried."""
    gw = gateway_of(request)
    if gw.projects is None:  # a node's own API: its gateway admitted the create
        info = await admitted.place(gw, spec)
        resp = model_response(info, 201)
        if (load := node_load(gw, info.node)) is not None:  # for the gateway's watcher
            resp.headers[LOAD_HEADER] = counts_header(load)
        return resp
    return model_response(await admitted.create_one(gw, principal_of(request), spec), 201)


@router.post("/sandboxes/batch", response_model=CreateManyResponse, status_code=201)
async def create_many(request: Request, req: CreateManyRequest) -> CreateManyResponse:
    """Split over the nodes by free room, one request per node, all at once. What fits
    nowhere gets a per-item error; a retry with the same ``request_id`` makes only what
    the first attempt did not."""
    gw = gateway_of(request)
    if gw.projects is None:
        made, errors = await create_batch(gw, req)
    else:
        made, errors = await admitted.create_many(gw, principal_of(request), req)
    return CreateManyResponse(sandboxes=made, errors=errors)


@router.get("/sandboxes", response_model=SandboxList)
async def list_sandboxes(request: Request, job: str | None = None,
                         label: list[str] = Query(default=[]),
                         request_id: str | None = None) -> SandboxList:
    labels = {}
    for item in label:
        k, sep, v = item.partition("=")
        if not sep:
            raise InvalidArgument(f"label filter must be key=value; got {item!r}")
        labels[k] = v
    return await list_all(gateway_of(request), job, labels, request_id)


@router.get("/sandboxes/{sb_id}", response_model=SandboxInfo)
@hot
async def get(request: Request, sb_id: str) -> Response:
    return model_response(await client_for(request, sb_id).get(sb_id))


@router.delete("/sandboxes/{sb_id}", status_code=204)
async def stop(request: Request, sb_id: str) -> None:
    await admitted.stop(gateway_of(request), client_for(request, sb_id), sb_id)


@router.post("/sandboxes/{sb_id}/pause", response_model=SandboxInfo)
async def pause(request: Request, sb_id: str) -> Response:
    return model_response(await client_for(request, sb_id).pause(sb_id))


@router.post("/sandboxes/{sb_id}/resume", response_model=SandboxInfo)
async def resume(request: Request, sb_id: str) -> Response:
    return model_response(await client_for(request, sb_id).resume(sb_id))


@router.post("/sandboxes/{sb_id}/exec", response_model=ExecResult)
@hot
async def exec_(request: Request, sb_id: str, req: ExecRequest) -> Response:
    check_grading(request, req.grading)
    return model_response(await while_valid(request, client_for(request, sb_id).exec(sb_id,
                                                                                     req)))


@router.post("/sandboxes/{sb_id}/shells", response_model=ShellInfo, status_code=201)
async def shell_open(request: Request, sb_id: str) -> ShellInfo:
    return await client_for(request, sb_id).shell_open(sb_id)


@router.post("/sandboxes/{sb_id}/shells/{sh_id}/run", response_model=ExecResult)
@hot
async def shell_run(request: Request, sb_id: str, sh_id: str,
                    req: ShellRunRequest) -> Response:
    return model_response(await while_valid(
        request, client_for(request, sb_id).shell_run(sb_id, sh_id, req)))


@router.delete("/sandboxes/{sb_id}/shells/{sh_id}", status_code=204)
async def shell_close(request: Request, sb_id: str, sh_id: str) -> None:
    await client_for(request, sb_id).shell_close(sb_id, sh_id)


@router.post("/sandboxes/{sb_id}/pack_diff", response_model=ImageSummary)
async def pack_diff(request: Request, sb_id: str, req: PackDiffRequest) -> ImageSummary:
    """A snapshot by a token that may not grade leaves the protected paths out: the new
    image would otherwise hand what the grader wrote to any sandbox made from it."""
    client = client_for(request, sb_id)
    gw = gateway_of(request)
    if gw.projects is not None and not reaches_protected(request):
        hidden = (await client.get(sb_id)).protected_paths
        if hidden:
            req = req.model_copy(update={"exclude": [*req.exclude, *hidden]})
    if gw.projects is not None:
        await tag_free_elsewhere(gw, client.node_id, req.tag)
    return await client.pack_diff(sb_id, req)


@router.get("/sandboxes/{sb_id}/screenshot", response_class=Response,
            responses=raw_answer("image/png", "the display as PNG"))
async def screenshot(request: Request, sb_id: str) -> Response:
    """The sandbox's display as PNG (``backend="vm"``; others answer Unsupported)."""
    return Response(await client_for(request, sb_id).screenshot(sb_id), media_type="image/png")


@router.post("/sandboxes/{sb_id}/input", status_code=204)
async def input_(request: Request, sb_id: str, req: InputRequest) -> None:
    """Type text, press keys or click (``backend="vm"``)."""
    await client_for(request, sb_id).input(sb_id, req)


@router.get("/nodes/load", include_in_schema=False)
@hot
async def node_loads(request: Request) -> Response:
    """Each healthy node's load now: what a gateway's watcher reads off a node's own API
    (every gateway asks every node each second: served on the fast lane)."""
    clients, _ = healthy_clients(gateway_of(request))
    got = await asyncio.gather(*(c.load() for c in clients), return_exceptions=True)
    return Response(json.dumps([load_to_wire(n) for n in got if isinstance(n, NodeLoad)]),
                    media_type="application/json")


@router.get("/nodes", response_model=list[NodeInfo])
async def nodes(request: Request) -> list[NodeInfo]:
    """Every node this gateway knows: those that answer as they are now, the others
    (``healthy: false``) with their last answer's figures and why they count as lost."""
    gw = gateway_of(request)
    clients, down = healthy_clients(gw)
    got = await asyncio.gather(*(c.node_info() for c in clients), return_exceptions=True)
    out = []
    for c, n in zip(clients, got):
        if isinstance(n, NodeInfo):
            out.append(n)
        elif isinstance(n, Exception):
            why = n.message if isinstance(n, DSecError) else f"{type(n).__name__}: {n}"
            out.append(lost_node(gw.watcher, c.node_id, why))
        else:
            raise n
    return out + [lost_node(gw.watcher, node_id) for node_id in down]


def node_load(gw, node_id: str) -> NodeLoad | None:
    """The load now of ``node_id`` when it lives in this process (a node's own API)."""
    load_now = getattr(gw.watcher.client(node_id), "load_now", None)
    return load_now() if load_now is not None else None
