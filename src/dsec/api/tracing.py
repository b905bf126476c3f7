"""The id of the request being served, for whatever runs on its behalf.

Set by the gateway for each request (``gateway/logs.py``); read by the HTTP node client,
which sends it on to the node as ``X-Request-Id`` so both logs carry the same id.
"""

from __future__ import annotations

from contextvars import ContextVar

__all__ = ["REQUEST_ID"]

REQUEST_ID: ContextVar[str | None] = ContextVar("dsec_request_id", default=None)
