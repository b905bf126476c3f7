"""A short path through the framework for the hottest routes (exec, create, get, and the
watchers' load probe).

FastAPI 0.16x matches a request against the routes of its included routers twice (once
to find the router, once inside it) and solves each route's dependencies through its
general machinery: under cProfile, in process over a simulated node, about 140 µs and
110 µs of an exec's 330 µs. :class:`FastLane` sits where the router sits,
inside every middleware and FastAPI's exception handling, and serves the routes marked
with :func:`hot` itself: it matches their path regex, parses the JSON body into the
route's model, and calls the endpoint. Anything it cannot do exactly as FastAPI would
(a body that is not JSON or does not validate, a content type other than JSON) goes to
the router untouched, with the body it read handed on, so errors keep their one shape.

A hot route's endpoint takes ``request``, ``str`` path parameters and at most one body
model, and returns a :class:`~starlette.responses.Response`; :meth:`FastLane.build`
refuses one that does not.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from fastapi import FastAPI
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette._utils import get_route_path
from starlette.requests import Request
from starlette.responses import Response

__all__ = ["hot", "FastLane", "install"]

_HOT = "__dsec_hot__"
_JSON = re.compile(rb"^application/json\s*(;.*)?$", re.IGNORECASE)


def hot(endpoint):
    """Mark a route's endpoint for :class:`FastLane` (put it under the route decorator)."""
    setattr(endpoint, _HOT, True)
    return endpoint


@dataclass(frozen=True)
class _Plan:
    """How to call one hot route: its regex, parameter names and body model."""

    route: APIRoute
    request_arg: str | None
    path_args: tuple[str, ...]
    body_arg: str | None
    body_model: type[BaseModel] | None

    @classmethod
    def of(cls, route: APIRoute) -> _Plan:
        d = route.dependant
        why = []
        if d.query_params or d.header_params or d.cookie_params or d.dependencies:
            why.append("query, header or cookie parameters or dependencies")
        if any(f.field_info.annotation is not str for f in d.path_params):
            why.append("a path parameter that is not str")
        body = d.body_params
        if len(body) > 1 or body and not (isinstance(body[0].field_info.annotation, type)
                                         and issubclass(body[0].field_info.annotation,
                                                        BaseModel)):
            why.append("a body other than one model")
        if (d.background_tasks_param_name or d.response_param_name or d.websocket_param_name
                or d.http_connection_param_name or d.security_scopes_param_name):
            why.append("a background-tasks, response, connection or security parameter")
        if why:
            raise TypeError(f"route {route.path} cannot be hot: it has {'; '.join(why)}")
        return cls(route=route, request_arg=d.request_param_name,
                   path_args=tuple(f.name for f in d.path_params),
                   body_arg=body[0].name if body else None,
                   body_model=body[0].field_info.annotation if body else None)


class FastLane:
    """Plain ASGI: serve the hot routes of ``plans``; hand everything else to ``app``."""

    def __init__(self, app, plans: list[_Plan]) -> None:
        self.app = app
        self.by_method: dict[str, list[_Plan]] = {}
        for plan in plans:
            for method in plan.route.methods or ():
                self.by_method.setdefault(method, []).append(plan)

    @classmethod
    def build(cls, app, routes) -> FastLane:
        """Over ``routes`` (an app's route table, flattened): the :func:`hot` ones."""
        return cls(app, [_Plan.of(r) for r in routes if getattr(r.endpoint, _HOT, False)])

    async def __call__(self, scope, receive, send):
        plans = self.by_method.get(scope.get("method", "")) if scope["type"] == "http" else None
        if plans:
            path = get_route_path(scope)
            for plan in plans:
                if m := plan.route.path_regex.match(path):
                    return await self._serve(plan, m.groupdict(), scope, receive, send)
        return await self.app(scope, receive, send)

    async def _serve(self, plan: _Plan, params: dict, scope, receive, send) -> None:
        kwargs: dict = {name: params[name] for name in plan.path_args}
        body = b""
        if plan.body_model is not None:
            body, more = await _read_body(receive)
            model = None if more else _parse(plan.body_model, body, scope)
            if model is None:  # FastAPI says what is wrong with it, in its own words
                return await self.app(scope, _replay(body, more, receive), send)
            kwargs[plan.body_arg] = model
        route = plan.route
        scope["endpoint"] = route.endpoint
        scope["route"] = route
        scope["path_params"] = {**scope.get("path_params", {}), **params}
        if plan.request_arg is not None:
            request = kwargs[plan.request_arg] = Request(scope, receive, send)
            request._body = body  # read already: an endpoint asking for it gets it
        response = await route.endpoint(**kwargs)
        if not isinstance(response, Response):
            raise TypeError(f"hot route {route.path} must return a Response; got "
                            f"{type(response).__name__}")
        await response(scope, receive, send)


async def _read_body(receive) -> tuple[bytes, bool]:
    """The request body; ``more`` is True if the client left before sending all of it."""
    chunks = []
    while True:
        msg = await receive()
        if msg["type"] != "http.request":
            return b"".join(chunks), True
        chunks.append(msg.get("body", b""))
        if not msg.get("more_body", False):
            return b"".join(chunks), False


def _parse(model: type[BaseModel], body: bytes, scope) -> BaseModel | None:
    """``body`` as ``model`` when it is JSON that validates (what FastAPI would pass the
    endpoint); None for anything FastAPI would answer with an error of its own."""
    ctype = next((v for k, v in scope.get("headers") or () if k == b"content-type"), None)
    if ctype is None or not _JSON.match(ctype) or not body:
        return None
    try:
        return model.model_validate(json.loads(body))
    # JSONDecodeError and UnicodeDecodeError are ValueErrors; RecursionError is JSON nested
    # past the interpreter's stack, which the router refuses as a 400 too
    except (ValueError, RecursionError, ValidationError):
        return None


def _replay(body: bytes, more: bool, receive):
    """A receive that hands the app what was read already, then the rest."""
    sent = False

    async def again():
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        if more:
            return {"type": "http.disconnect"}
        return {"type": "http.request", "body": body, "more_body": False}

    return again


def _flat(routes):
    """Every APIRoute of ``routes``, with those of the routers included in them. A hot
    route must be one the lane matches as FastAPI does: in a router included with no
    prefix and no dependencies of its own."""
    for r in routes:
        if isinstance(r, APIRoute):
            yield r
        elif (inner := getattr(r, "original_router", None)) is not None:  # included router
            ctx = r.include_context
            if ctx.prefix or ctx.dependencies or inner.dependencies:
                if any(getattr(x.endpoint, _HOT, False) for x in _flat(inner.routes)):
                    raise TypeError("hot routes must be in a router included with no "
                                    "prefix or dependencies")
                continue
            yield from _flat(inner.routes)


def install(app: FastAPI) -> None:
    """Put a :class:`FastLane` in front of ``app``'s router (inside every middleware and
    FastAPI's exception handling, so a hot route's errors are answered as any other's).
    Call after every router is included."""
    router = app.router
    router.middleware_stack = FastLane.build(router.middleware_stack, _flat(router.routes))
