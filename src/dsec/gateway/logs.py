"""Structured logs: one JSON object per line, with the request id of the request it is
about on every line logged while that request runs.

:func:`configure` routes every stdlib logger (``dsec.*``, uvicorn's) through structlog's
JSON renderer. :class:`RequestIds` gives each HTTP request and WebSocket an id (the
caller's ``X-Request-Id`` when it is a sane one, else ``req-<process>-<n>``), binds it in a
context variable for everything the request runs, tasks it starts included, answers it
in ``X-Request-Id``, counts it in the request metrics, and logs one line per failed
request (status 400 and up; every request with ``DSEC_LOG_REQUESTS=1``). Lines logged outside any request (the reaper, the
watcher, startup) carry ``"request_id": null``.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import secrets
import sys
import time

import structlog

from dsec.api.tracing import REQUEST_ID

__all__ = ["configure", "RequestIds", "request_logger"]

_SANE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
# A request id names a request in logs, it guards nothing: a random tag per process and a
# count (secrets.token_hex per request was a getrandom call, 1% of a relayed create's CPU)
_PROCESS = secrets.token_hex(4)
_count = itertools.count(1)
request_logger = structlog.get_logger("dsec.request")
_bind, _reset = structlog.contextvars.bind_contextvars, structlog.contextvars.reset_contextvars


def _request_id_always(_, __, event: dict) -> dict:
    event.setdefault("request_id", None)
    return event


def configure(level: int = logging.INFO) -> None:
    """JSON lines on stderr for every logger of this process."""
    shared = [structlog.contextvars.merge_contextvars, _request_id_always,
              structlog.stdlib.add_log_level, structlog.stdlib.add_logger_name,
              structlog.processors.TimeStamper(fmt="iso", utc=True)]
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger, cache_logger_on_first_use=True)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info,
                    structlog.processors.JSONRenderer()]))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.captureWarnings(True)  # a library's warning is a log line like any other
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []  # theirs would print plain text too
        logging.getLogger(name).propagate = True


class RequestIds:
    """Plain ASGI middleware: the request id, its context, its header, its log line."""

    def __init__(self, app, metrics=None) -> None:
        self.app = app
        self.log_all = os.environ.get("DSEC_LOG_REQUESTS", "") not in ("", "0")
        self.metrics = metrics  # a RequestMetrics: HTTP requests counted as they end

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        given = dict(scope.get("headers") or []).get(b"x-request-id", b"").decode("latin-1")
        rid = given if _SANE.match(given) else f"req-{_PROCESS}-{next(_count):x}"
        status = 0
        t0 = time.perf_counter()

        async def tagged(msg):
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]
                msg = {**msg, "headers": [*msg.get("headers", []),
                                          (b"x-request-id", rid.encode())]}
            await send(msg)

        token = REQUEST_ID.set(rid)
        # bind and reset by hand: bound_contextvars is a generator-based context manager
        # and costs more than the binding itself, on every request
        bound = _bind(request_id=rid)
        try:
            await self.app(scope, receive, tagged)
        finally:
            REQUEST_ID.reset(token)
            if self.metrics is not None and scope["type"] == "http":
                self.metrics.count(scope, status)
            if self.log_all or status >= 400 or status == 0 and scope["type"] == "http":
                request_logger.info("request", method=scope.get("method", "WS"),
                                    path=scope.get("path", ""), status=status or None,
                                    ms=round((time.perf_counter() - t0) * 1000, 2))
            _reset(**bound)
