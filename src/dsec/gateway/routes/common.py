"""Helpers shared by the routers: the gateway's parts, and the node owning a sandbox."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel

from dsec.api.errors import Forbidden, NodeLost, Unauthorized, shorten
from dsec.cluster.base import Cluster
from dsec.cluster.nodeclient import NodeClient
from dsec.gateway.placer import Placer
from dsec.gateway.auth import principal_of
from dsec.gateway.projects import Projects
from dsec.gateway.projects.roles import GRADER, may_grade
from dsec.gateway.watcher import Watcher

__all__ = ["Gateway", "gateway_of", "client_for", "model_response", "check_grading",
           "reaches_protected", "validity", "next_while", "revoked", "RECHECK_S"]

RECHECK_S = 1.0  # how often a long stream asks whether its token still works


@dataclass
class Gateway:
    """What every route of one gateway shares; no per-sandbox state."""

    cluster: Cluster
    watcher: Watcher
    placer: Placer
    projects: Projects | None = None  # None on a node's own API: its gateways enforce them


def gateway_of(request: Request) -> Gateway:
    return request.app.state.gateway


def client_for(request: Request, sb_id: str) -> NodeClient:
    """The node named in ``sb_id``: NotFound if no node has that name, NodeLost at once if
    the watcher saw it stop answering (no request is sent to it)."""
    gw = gateway_of(request)
    client = gw.cluster.client_for(sb_id)
    if not gw.watcher.healthy(client.node_id):
        view = gw.watcher.view(client.node_id)
        why = f" ({view.error})" if view is not None and view.error else ""
        raise NodeLost(f"node {client.node_id}, which holds {shorten(sb_id)}, does not "
                       f"answer{why}; "
                       "its sandboxes are reachable again when it comes back")
    return client


def model_response(model: BaseModel, status_code: int = 200) -> Response:
    """``model`` as JSON bytes, serialised once. The hottest routes return this instead of
    the model: FastAPI would validate the model again against the route's response_model
    and encode it twice (the route keeps response_model for the OpenAPI schema)."""
    return Response(type(model).__pydantic_serializer__.to_json(model),
                    status_code=status_code, media_type="application/json")


def check_grading(request: Request, grading: bool) -> None:
    """A command with ``grading=True`` reaches the sandbox's protected paths: only a
    grader or admin token may ask for one (Forbidden, audited, otherwise). A node's own
    API takes it from its gateway, which checked."""
    projects, who = gateway_of(request).projects, principal_of(request)
    if not grading or projects is None or who is None or may_grade(who.role):
        return
    err = Forbidden(f"grading=True reaches the sandbox's protected paths: a {who.role} token "
                    f"may not ask for it; run the grading step with a {GRADER} (or admin) "
                    "token of the project")
    projects.audit.record(who.project, who.who, f"{request.method} {request.url.path}",
                          "grading=True", f"forbidden: {err.message}")
    raise err


def reaches_protected(request: Request, asked: bool = False) -> bool:
    """Whether this request's file operations reach the sandbox's protected paths: at a
    gateway, when its token may grade (a grader or admin; the root token is one); at a
    node's own API, when its gateway said so (``asked``, the ``grading`` parameter)."""
    if gateway_of(request).projects is None:
        return asked
    who = principal_of(request)
    return who is not None and may_grade(who.role)


def validity(request: Request) -> Callable[[], bool] | None:
    """How a long stream (an exec stream, a process follow, a terminal) asks whether its
    caller's token still works (None: always, for the root token or a node's own API)."""
    projects, who = gateway_of(request).projects, principal_of(request)
    if projects is None or who is None or who.token_hash is None:
        return None
    asked_at, ok = 0.0, True  # asked at most once per RECHECK_S, however fast events come

    def valid() -> bool:
        nonlocal asked_at, ok
        now = time.monotonic()
        if now - asked_at >= RECHECK_S:
            asked_at, ok = now, projects.still_valid(who)
        return ok
    return valid


def revoked() -> Unauthorized:
    return Unauthorized("the token of this stream was revoked, expired or lost its project; "
                        "the command was ended")


async def next_while(events: AsyncIterator, valid: Callable[[], bool] | None):
    """The stream's next event, or Unauthorized once its token was revoked (asked every
    ``RECHECK_S`` while the command is silent, and at every event)."""
    if valid is None:
        return await events.__anext__()
    step = asyncio.ensure_future(events.__anext__())
    while True:
        done, _ = await asyncio.wait({step}, timeout=RECHECK_S)
        if not valid():
            step.cancel()
            raise revoked()
        if done:
            return step.result()
