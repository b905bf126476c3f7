"""Helpers shared by the routers: the gateway's parts, and the node owning a sandbox."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel

from dsec.api.errors import Forbidden, NodeLost, Unauthorized, Unavailable, shorten
from dsec.cluster.base import Cluster
from dsec.cluster.nodeclient import NodeClient
from dsec.gateway.placer import Placer
from dsec.gateway.auth import principal_of
from dsec.gateway.projects import Projects
from dsec.gateway.projects.roles import GRADER, may_grade
from dsec.gateway.watcher import Watcher

__all__ = ["Gateway", "gateway_of", "client_for", "model_response", "check_grading",
           "reaches_protected", "validity", "recheck", "next_while", "while_valid",
           "revoked", "RECHECK_S"]

RECHECK_S = 1.0  # how often a long call or stream asks whether its token still works
T = TypeVar("T")


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
    """How a long call or stream (an exec, an exec stream, a process follow, a terminal)
    asks whether its caller's token still works (None: always, for the root token or a node's own API)."""
    projects, who = gateway_of(request).projects, principal_of(request)
    if projects is None or who is None or who.token_hash is None:
        return None
    return recheck(lambda: projects.still_valid(who))


def recheck(ask: Callable[[], bool]) -> Callable[[], bool]:
    """``ask``, asked at most once per RECHECK_S however fast events come; its last
    answer in between."""
    asked_at, ok = 0.0, True

    def valid() -> bool:
        nonlocal asked_at, ok
        now = time.monotonic()
        if now - asked_at >= RECHECK_S:
            asked_at, ok = now, ask()
        return ok
    return valid


async def _while_connected(request: Request, call: Awaitable[T]) -> T:
    """``call``'s answer, cancelled if the client leaves first: at a node's own API, a
    gateway that gave up on a call (its caller's token was revoked) closes the connection,
    and the command ends here too instead of running to its timeout."""
    me = asyncio.current_task()
    assert me is not None
    gone = False

    async def watch() -> None:
        nonlocal gone
        try:  # the body was read: what comes next is the client leaving
            while (await request.receive())["type"] != "http.disconnect":
                pass
        except Exception:  # the server's receive failed: nothing to watch
            return
        gone = True
        me.cancel()

    # cancelled (below) before this task runs again: a disconnect it already read is
    # dropped then, so its cancellation can only land inside ``call``
    watcher = asyncio.ensure_future(watch())
    try:
        got = await call
    except asyncio.CancelledError:
        if not gone:
            raise
        me.uncancel()
        raise Unavailable("the client left before the call ended; it was ended") from None
    finally:
        watcher.cancel()
    if gone:  # the call swallowed its cancellation; no one hears the answer anyway
        me.uncancel()
    return got


def revoked() -> Unauthorized:
    return Unauthorized("the token of this call was revoked, expired or lost its project "
                        "while it ran; the call was ended")


async def while_valid(request: Request, call: Awaitable[T]) -> T:
    """``call``'s answer, or Unauthorized once the caller's token stops working while it
    runs (asked every ``RECHECK_S``): the call is cancelled, which ends an exec's or a
    shell's command (on a remote node too: its own API ends the call when the gateway
    drops the request). For the calls that wait on a command (exec, shell run, process
    wait); a stream asks with :func:`next_while`.

    One timer per call, no task: the timer runs only while this request's task waits in
    ``call`` (it is cancelled as soon as ``call`` returns), so its cancellation always
    lands inside ``call``."""
    valid = validity(request)
    if valid is None:
        if gateway_of(request).projects is None:  # a node's own API
            return await _while_connected(request, call)
        return await call
    loop, me = asyncio.get_running_loop(), asyncio.current_task()
    assert me is not None
    ended = False
    timer: asyncio.TimerHandle | None = None

    def check() -> None:
        nonlocal timer, ended
        if valid():
            timer = loop.call_later(RECHECK_S, check)
        else:
            ended = True
            me.cancel()

    timer = loop.call_later(RECHECK_S, check)
    try:
        got = await call
    except asyncio.CancelledError:
        if not ended:
            raise
        me.uncancel()
        raise revoked() from None
    finally:
        if timer is not None:
            timer.cancel()
    if ended:  # the call swallowed its cancellation: its answer is not the caller's now
        me.uncancel()
        raise revoked()
    return got


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
