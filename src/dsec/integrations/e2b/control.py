"""E2B's control plane (``E2B_API_URL=<dsec>/e2b``): sandboxes made, listed, kept, ended.

Every route goes through the gateway's own sandbox routes and :func:`client_for`, so it
works the same over the embedded node and over a cluster. A template is a dsec image name.
Metadata becomes the sandbox's labels; the keys ``dsec.backend``, ``dsec.cpu``,
``dsec.memory_mb`` and ``dsec.disk_mb`` also size the sandbox (E2B keeps that in the
template, which dsec images do not carry). A create is admitted like dsec's own: in the
API key's project, under its quota; ``dsec.wait_s`` lets it wait in line (0, E2B's
behaviour, by default), and a refusal is 429, the SDK's ``RateLimitException``
(marked not to be retried: :func:`_retry_headers`). Errors answer E2B's ``{"code", "message"}``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from urllib.parse import parse_qsl

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute

from dsec.api.errors import DSecError, InvalidArgument, NotFound, QuotaExceeded
from dsec.api.models import SandboxInfo, SandboxSpec, describe, validated
from dsec.api.process import MAX_TIMEOUT_S
from dsec.gateway.routes.common import client_for, gateway_of
from dsec.gateway import admitted
from dsec.gateway.auth import principal_of
from dsec.gateway.projects.roles import allows
from dsec.gateway.spread import list_all
from dsec.integrations.e2b.auth import ROOT, Keys
from dsec.integrations.e2b.callers import calling
from dsec.integrations.e2b.config import E2BConfig
from dsec.integrations.e2b.models import (ConnectRequest, NewSandbox, TimeoutRequest, created,
                                          detail, listed)

__all__ = ["control_router", "fallback_router"]

_SIZING = {"dsec.backend": "backend", "dsec.cpu": "cpu", "dsec.memory_mb": "memory_mb",
           "dsec.disk_mb": "disk_mb", "dsec.wait_s": "wait_s"}


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status,
                        headers=headers)


class _E2BRoute(APIRoute):
    """Checks the API key first (:func:`~.callers.calling`: a dsec token, whose project the
    call runs in), and answers every failure in E2B's error shape (429 with
    ``Retry-After``, which the SDK raises as ``RateLimitException``)."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                with calling(request):
                    return await handler(request)
            except DSecError as exc:
                return _error(exc.status, exc.message, _retry_headers(exc))
            except RequestValidationError as exc:
                return _error(400, describe(exc))

        return route


def _retry_headers(exc: DSecError) -> dict[str, str] | None:
    """``Retry-After`` on a 429. A quota refusal also says ``Should-Retry: false``: dsec
    already kept the create in its project's FIFO line for the ``dsec.wait_s`` it asked
    for, and the SDK's blind retries (3 by default) would jump that line; a full cluster
    (Capacity) is left to the SDK's retries."""
    retry = getattr(exc, "retry_after_s", None)
    if retry is None:
        return None
    headers = {"retry-after": str(retry)}
    if isinstance(exc, QuotaExceeded):
        headers["should-retry"] = "false"
    return headers


def _access_token(request: Request, sb_id: str) -> str:
    """The envd access token of ``sb_id`` for this call's dsec token: it stops working when
    that token is revoked or expires (a node's own API: its credential's, ``root``)."""
    keys: Keys = request.app.state.e2b_keys
    who = principal_of(request)
    return keys.access_token(sb_id, ROOT if who is None else who.who)


def _not_found(sb_id: str) -> NotFound:
    return NotFound(f"sandbox {sb_id} not found")


def _spec(body: NewSandbox, config: E2BConfig) -> SandboxSpec:
    refused = [name for name, value in (
        ("autoPause", body.auto_pause), ("network", body.network), ("mcp", body.mcp),
        ("iam", body.iam), ("volumeMounts", body.volume_mounts),
        ("autoResume", body.auto_resume)) if value]
    if refused:
        raise InvalidArgument(f"dsec's E2B API does not support {', '.join(refused)}: leave "
                              f"{'it' if len(refused) == 1 else 'them'} unset")
    if body.allow_internet_access:
        raise InvalidArgument("allow_internet_access=True is not supported: sandboxes made "
                              "through dsec's E2B API have loopback networking only; leave "
                              "it unset or False")
    metadata = body.metadata or {}
    sizing = {field: metadata[key] for key, field in _SIZING.items() if key in metadata}
    timeout = body.timeout if body.timeout else config.default_timeout_s
    return validated(SandboxSpec, image=body.template_id, labels=metadata,
                     env=body.env_vars or {}, ttl_s=float(timeout), **sizing)


async def _info(request: Request, sb_id: str) -> SandboxInfo:
    info = await client_for(request, sb_id).get(sb_id)
    if info.state in ("stopped", "failed"):
        raise _not_found(sb_id)
    return info


def _metadata_filter(raw: str | None) -> dict[str, str]:
    """``k=v&k2=v2`` (each part URL-quoted) as label filters."""
    return dict(parse_qsl(raw or "", keep_blank_values=True))


def control_router(config: E2BConfig) -> APIRouter:
    """The routes under ``/e2b``."""
    router = APIRouter(prefix="/e2b", route_class=_E2BRoute, include_in_schema=False)

    async def create(request: Request, body: NewSandbox) -> JSONResponse:
        spec = _spec(body, config)
        gw = gateway_of(request)
        try:
            if gw.projects is None:  # a node's own API: its gateway admitted the create
                info = await admitted.place(gw, spec)
            else:
                info = await admitted.create_one(gw, principal_of(request), spec)
        except NotFound as exc:
            if spec.image not in exc.message:
                raise
            raise NotFound(f"template {spec.image!r} not found: a template is a dsec image "
                           f"name (`dsec images` lists them): {exc.message}") from exc
        return JSONResponse(created(info, _access_token(request, info.id)).model_dump(
            exclude_none=True), status_code=201)

    router.post("/sandboxes")(create)
    router.post("/v2/sandboxes")(create)

    async def list_(request: Request, metadata: str | None = None, state: str | None = None,
                    limit: int = 100, nextToken: str | None = None) -> JSONResponse:
        if not 1 <= limit <= 10000:
            raise InvalidArgument(f"limit must be between 1 and 10000; got {limit}")
        if nextToken is not None and not nextToken.isdigit():
            raise InvalidArgument(f"nextToken {nextToken[:40]!r} is not one this API gave")
        wanted = set((state or "running,paused").split(","))
        if bad := wanted - {"running", "paused"}:
            raise InvalidArgument(f"state must be running and/or paused; got {sorted(bad)}")
        found = await list_all(gateway_of(request), labels=_metadata_filter(metadata))
        rows = sorted((listed(s) for s in found.sandboxes if s.state not in
                       ("stopped", "failed")), key=lambda r: (r.startedAt, r.sandboxID))
        rows = [r for r in rows if r.state in wanted]
        start = int(nextToken or 0)
        page = rows[start:start + limit]
        headers = {"x-next-token": str(start + limit)} if start + limit < len(rows) else {}
        return JSONResponse([r.model_dump(exclude_none=True) for r in page], headers=headers)

    router.get("/sandboxes")(list_)
    router.get("/v2/sandboxes")(list_)

    @router.get("/sandboxes/{sb_id}")
    async def get(request: Request, sb_id: str) -> JSONResponse:
        info = await _info(request, sb_id)
        who = principal_of(request)
        # envd's access token runs commands: a viewer (read-only) is not given it
        token = _access_token(request, sb_id) if who is None or allows(
            who.role, who.project, "user") else None
        return JSONResponse(detail(info, token).model_dump(exclude_none=True))

    @router.delete("/sandboxes/{sb_id}", status_code=204)
    async def kill(request: Request, sb_id: str) -> Response:
        await _info(request, sb_id)
        await admitted.stop(gateway_of(request), client_for(request, sb_id), sb_id)
        return Response(status_code=204)

    @router.post("/sandboxes/{sb_id}/pause", status_code=204)
    async def pause(request: Request, sb_id: str) -> Response:
        if (await _info(request, sb_id)).state == "paused":
            return _error(409, f"sandbox {sb_id} is already paused")
        await client_for(request, sb_id).pause(sb_id)
        return Response(status_code=204)

    async def connect(request: Request, sb_id: str,
                      body: ConnectRequest | None = None) -> JSONResponse:
        info = await _info(request, sb_id)
        status = 200
        if info.state == "paused":
            info = await client_for(request, sb_id).resume(sb_id)
            status = 201
        if body is not None and body.timeout:
            info = await _extend(request, info, body.timeout, only_longer=True)
        return JSONResponse(created(info, _access_token(request, sb_id)).model_dump(
            exclude_none=True), status_code=status)

    router.post("/sandboxes/{sb_id}/connect")(connect)
    router.post("/v2/sandboxes/{sb_id}/connect")(connect)
    router.post("/sandboxes/{sb_id}/resume")(connect)

    @router.post("/sandboxes/{sb_id}/timeout", status_code=204)
    async def set_timeout(request: Request, sb_id: str, body: TimeoutRequest) -> Response:
        await _extend(request, await _info(request, sb_id), body.timeout, only_longer=False)
        return Response(status_code=204)

    return router


def fallback_router() -> APIRouter:
    """Anything else under ``/e2b`` (templates, metrics, snapshots, volumes...): a clear
    501 in E2B's shape, which the SDK raises as its own error (a framework 404 in dsec's
    shape would not parse as E2B's)."""
    router = APIRouter(prefix="/e2b", route_class=_E2BRoute, include_in_schema=False)

    @router.api_route("/{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    async def unserved(request: Request, rest: str) -> JSONResponse:
        return _error(501, f"dsec's E2B API does not serve {request.method} /{rest}: it "
                           "serves sandboxes (create, list, get, connect, timeout, pause, "
                           "kill), their commands and their files")

    return router


async def _extend(request: Request, info: SandboxInfo, timeout: int,
                  only_longer: bool) -> SandboxInfo:
    """Make the sandbox end ``timeout`` seconds from now (``only_longer``: unless it ends
    later already, as E2B's connect does)."""
    if timeout > MAX_TIMEOUT_S:
        raise InvalidArgument(f"timeout must be at most {MAX_TIMEOUT_S:g} s; got {timeout}")
    ends = time.time() + timeout
    if only_longer and info.expires_at is not None and info.expires_at >= ends:
        return info
    return await client_for(request, info.id).set_timeout(info.id, float(timeout))
