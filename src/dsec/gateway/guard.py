"""What stands between a hostile request and the routes: one error shape for every failure.

:class:`RequestGuard` refuses, before routing, a URL carrying a NUL byte and a JSON body
past ``limits.body_bytes`` (file and blob uploads stream and have their own limits).
:func:`install_error_handlers` maps every error to ``{"error": {"code", "message"}}``: a
:class:`DSecError` with its status, a validation error as ``invalid_argument``, and any
other exception as ``internal`` naming the route, so no route ever answers a bare 500. An
``internal`` answer is still a bug to fix where it arose; this only keeps its shape.
"""

from __future__ import annotations

import json
import logging
import re
from urllib.parse import parse_qsl, unquote

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from dsec.api import limits
from dsec.api.models import describe
from dsec.api.errors import (DSecError, Internal, InvalidArgument, NotFound, TooLarge,
                             Unauthorized, shorten)

__all__ = ["RequestGuard", "install_error_handlers", "TOO_DEEP"]

log = logging.getLogger("dsec.gateway")
TOO_DEEP = ("the JSON body is nested too deeply to parse; send one with fewer levels of "
            "arrays and objects")
# bodies that stream to a file and carry their own byte limits
_STREAMED = re.compile(r"^(/v1/(sandboxes/[^/]+/files(/tar)?|blobs/[^/]+)|(/e2b/envd)?/files)$")


def _response(err: DSecError) -> JSONResponse:
    retry = getattr(err, "retry_after_s", None)
    headers = {"retry-after": str(retry)} if retry else None
    return JSONResponse(err.to_wire(), status_code=err.status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    """Every failure of every route answers with the one wire error shape."""

    @app.exception_handler(DSecError)
    async def _dsec_error(request: Request, exc: DSecError) -> JSONResponse:
        return _response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _response(InvalidArgument(describe(exc)))

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        # the framework's own refusals (no such route, wrong method): same shape
        cls = {401: Unauthorized, 404: NotFound, 413: TooLarge}.get(exc.status_code,
                                                                     InvalidArgument)
        if exc.status_code >= 500:
            cls = Internal
        detail = exc.detail
        if isinstance(exc.__cause__, RecursionError):  # FastAPI says only "error parsing"
            detail = TOO_DEEP
        body = cls(f"{request.method} {shorten(request.url.path)}: {detail}").to_wire()
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return _response(Internal(f"{request.method} {shorten(request.url.path)} failed "
                                  f"unexpectedly ({type(exc).__name__}); the server log has "
                                  "the details"))


def _url_problem(scope) -> str | None:
    path = scope.get("path", "")
    if "\0" in path or "%00" in scope.get("raw_path", b"").decode("latin-1").lower():
        return "the URL path must not contain NUL bytes (%00)"
    query = scope.get("query_string", b"").decode("latin-1")
    if "%00" in query.lower() or "\0" in query:
        for key, value in parse_qsl(query, keep_blank_values=True):
            if "\0" in key or "\0" in value:
                return f"query parameter {unquote(key)[:64]!r} must not contain NUL bytes (%00)"
        return "the query string must not contain NUL bytes (%00)"
    return None


class RequestGuard:
    """Plain ASGI middleware: refuse NUL bytes in URLs and JSON bodies past the limit."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        if why := _url_problem(scope):
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 4400})
                return
            return await _send(send, InvalidArgument(why))
        if scope["type"] != "http" or _STREAMED.match(scope["path"]):
            return await self.app(scope, receive, send)
        cap = limits.active().body_bytes
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length", b"")
        if length.isdigit() and int(length) > cap:
            return await _send(send, _too_big(int(length), cap))
        seen = 0
        started = answered = False

        async def counted():
            nonlocal seen, answered
            if answered:
                return {"type": "http.disconnect"}
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > cap and not started:
                    # answer now and tell the app the client left: it stops reading
                    answered = True
                    await _send(send, _too_big(seen, cap, streamed=True))
                    return {"type": "http.disconnect"}
            return msg

        async def watched(msg):
            nonlocal started
            if answered:
                return
            started = started or msg["type"] == "http.response.start"
            await send(msg)

        await self.app(scope, counted, watched)


def _too_big(size: int, cap: int, streamed: bool = False) -> TooLarge:
    what = f"more than {cap}" if streamed else str(size)
    return TooLarge(f"the request body holds {what} bytes; JSON bodies may hold at most {cap} "
                    f"bytes (node limits.body_bytes); send files through the files API")


async def _send(send, err: DSecError) -> None:
    body = json.dumps(err.to_wire()).encode()
    await send({"type": "http.response.start", "status": err.status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
