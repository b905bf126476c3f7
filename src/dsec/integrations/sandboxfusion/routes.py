"""SandboxFusion's HTTP API on dsec: ``POST /sandboxfusion/<token>/run_code`` and friends.

The token goes in the URL because SandboxFusion's clients (the ``sandbox-fusion`` package,
verl's ``sandbox_fusion`` tool) send no credentials: :class:`PathToken` moves it into the
Authorization header before the gateway's auth sees the request (and takes it out of the
path, so no log line or error message quotes it). A bad request answers SandboxFusion's own
422 ``{"detail": [...]}``; a language no image here has, or a call dsec cannot run, answers
200 with ``status: SandboxError`` and a message saying why, as SandboxFusion does.
"""

from __future__ import annotations

import json

from fastapi import APIRouter, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from dsec.api.errors import DSecError
from dsec.integrations.sandboxfusion.gateway import Availability, InProcessGateway
from dsec.integrations.sandboxfusion.languages import RECIPES, UNAVAILABLE
from dsec.integrations.sandboxfusion.models import RunCodeRequest, RunCodeResponse, RunStatus
from dsec.integrations.sandboxfusion.plan import BadRequest, answer, plan, scala_error

__all__ = ["router", "PathToken", "PREFIX", "DEFAULT_IMAGES"]

PREFIX = "/sandboxfusion"
# the full toolchain image of `make images` first, then the base image of `make run`
DEFAULT_IMAGES = ["sandboxfusion:1", "python:3.11"]

# SandboxFusion's protocol (its own bodies, 422 refusals), for its own client: like the E2B
# routes, not part of dsec's OpenAPI document
router = APIRouter(prefix=PREFIX, tags=["sandboxfusion"], include_in_schema=False)


class PathToken:
    """ASGI middleware: ``/sandboxfusion/<token>/<route>`` becomes ``/sandboxfusion/<route>``
    with ``Authorization: Bearer <token>``. Place it outside the gateway's auth."""

    def __init__(self, app) -> None:
        self.app = app
        self.prefix = PREFIX + "/"

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if scope["type"] == "http" and path.startswith(self.prefix):
            token, sep, rest = path[len(self.prefix):].partition("/")
            if token and sep:
                headers = [(k, v) for k, v in scope.get("headers") or []
                           if k != b"authorization"]
                headers.append((b"authorization", b"Bearer " + token.encode("latin-1")))
                new = self.prefix + rest
                # in place: the server-error middleware outside this one reads the same
                # scope, and its messages must not quote the token either
                scope.update(path=new, raw_path=new.encode("latin-1"), headers=headers)
        return await self.app(scope, receive, send)


def _state(request: Request) -> Availability:
    app = request.app
    avail = getattr(app.state, "sandboxfusion", None)
    if avail is None:
        images = getattr(app.state, "sandboxfusion_images", None) or DEFAULT_IMAGES
        avail = app.state.sandboxfusion = Availability(InProcessGateway(app), list(images))
    return avail


def _invalid(errors: list[dict]) -> JSONResponse:
    """FastAPI's (and so SandboxFusion's) answer to a request that does not validate."""
    return JSONResponse({"detail": jsonable_encoder(errors)}, status_code=422)


async def _parse(request: Request) -> RunCodeRequest | JSONResponse:
    try:
        body = json.loads(await request.body())
    except (ValueError, UnicodeDecodeError) as exc:
        return _invalid([{"type": "json_invalid", "loc": ["body"],
                          "msg": f"the body must be JSON: {exc}"}])
    except RecursionError:  # nested past the interpreter's stack
        return _invalid([{"type": "json_invalid", "loc": ["body"],
                          "msg": "the JSON body is nested too deeply to parse; send one with "
                                 "fewer levels of arrays and objects"}])
    try:
        return RunCodeRequest.model_validate(body)
    except ValidationError as exc:
        return _invalid([{**e, "loc": ["body", *e["loc"]]}
                         for e in exc.errors(include_url=False)])


def _sandbox_error(message: str) -> RunCodeResponse:
    return RunCodeResponse(status=RunStatus.SandboxError, message=message)


def _unavailable(avail: Availability, language: str) -> str:
    if language in UNAVAILABLE:
        return f"language {language!r} is not available on dsec: {UNAVAILABLE[language]}"
    return (f"language {language!r} is not available: none of the images "
            f"{', '.join(avail.images)} on this server has its toolchain; "
            "`make images` builds sandboxfusion:1, which has every language Debian packages")


@router.post("/run_code", response_model=RunCodeResponse, summary="SandboxFusion run_code")
async def run_code(request: Request):
    """Run one program as SandboxFusion's ``/run_code`` does, on a dsec fncall worker."""
    req = await _parse(request)
    if isinstance(req, JSONResponse):
        return req
    auth = request.headers.get("authorization", "")
    avail = _state(request)
    if req.language in RECIPES and (early := scala_error(req)) is not None:
        return early
    try:
        image = await avail.image_for(req.language, auth) if req.language in RECIPES else None
        if image is None:
            return _sandbox_error(_unavailable(avail, req.language))
        call = plan(req, image)
        out = await avail.gateway.fncall(call.request, auth)
    except BadRequest as exc:
        return _invalid([{"type": "value_error", "loc": exc.loc, "msg": str(exc)}])
    except ValidationError as exc:  # a limit of dsec's fncall (file paths, sizes)
        return _invalid([{**e, "loc": ["body", *e["loc"]]}
                         for e in exc.errors(include_url=False)])
    except DSecError as exc:
        return _sandbox_error(f"dsec could not run the code ({exc.code}): {exc.message}")
    return answer(call, out)


@router.post("/run_jupyter", summary="SandboxFusion run_jupyter (not available)")
async def run_jupyter() -> dict:
    """dsec runs no Jupyter kernels: SandboxFusion's SandboxError answer, saying so."""
    return {"status": "SandboxError", "cells": [], "files": {},
            "message": "run_jupyter is not available on dsec; use run_code"}


@router.get("/v1/ping", summary="SandboxFusion ping")
async def ping() -> str:
    return "pong"
