"""Who calls E2B's control plane: the API key is a dsec token, checked as the gateway's
own bearer auth checks it.

On a gateway the key may be the root token or any project token
(:meth:`~dsec.gateway.projects.Projects.authenticate`): the call then needs the same role
as the matching dsec call (:mod:`~dsec.gateway.projects.roles`), runs in the token's
project (:data:`~dsec.api.scope.caller_scope`, so another project's sandbox is not found),
and its creates go through the project's quota and queued admission. Refusals are
audited like the gateway's. On a node's own API (no projects) the key is the credential
that API takes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from fastapi import Request

from dsec.api.errors import Forbidden, Unauthorized
from dsec.api.scope import caller_scope
from dsec.gateway.projects import Principal
from dsec.gateway.projects.roles import allows, needed
from dsec.gateway.routes.common import gateway_of
from dsec.integrations.e2b.auth import Keys

__all__ = ["calling"]

_WRONG_KEY = "missing or wrong API key: set E2B_API_KEY to a dsec token"


@contextmanager
def calling(request: Request) -> Iterator[Principal | None]:
    """The caller of ``request`` for the length of the block (None on a node's own API),
    its project the request's scope; Unauthorized or Forbidden saying why not."""
    key = request.headers.get("x-api-key")
    projects = gateway_of(request).projects
    if projects is None:
        keys: Keys = request.app.state.e2b_keys
        if not keys.api_key_ok(key):
            raise Unauthorized(_WRONG_KEY)
        yield None
        return
    action = f"{request.method} {request.url.path}"
    try:
        who = projects.authenticate(f"Bearer {key or ''}".encode("utf-8", "surrogatepass"))
    except Unauthorized as exc:
        projects.audit.record("", "unknown", action, "", f"unauthorized: {exc.message}")
        if exc.message.startswith("missing or wrong"):
            raise Unauthorized(_WRONG_KEY) from None
        raise Unauthorized(f"E2B_API_KEY: {exc.message}") from None
    # the dsec route each E2B call stands for: the same role is needed
    need = needed(request.method, "/v1/sandboxes")
    if not allows(who.role, who.project, need):
        err = Forbidden(f"a {who.role} token of project {who.project or '(root)'!r} may not "
                        f"{action}; it needs {need}")
        projects.audit.record(who.project, who.who, action, "", f"forbidden: {err.message}")
        raise err
    request.scope["dsec.principal"] = who
    mark = caller_scope.set(None if who.project == "" else who.project)
    try:
        yield who
    finally:
        caller_scope.reset(mark)
