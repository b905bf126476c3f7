"""Who may call: user tokens at a gateway, the cluster credential at a node's own API.

Both are plain ASGI middleware that run before routing and body parsing, so a wrong or
missing token gets 401 whatever the path, id or body: a caller without a token learns
nothing about what exists.

- :class:`BearerAuth` (a gateway): the root token or a project token
  (:class:`~dsec.gateway.projects.Projects`), then the role the route needs
  (:mod:`~dsec.gateway.projects.roles`; 403 otherwise). The caller's project becomes the
  request's :data:`~dsec.api.scope.caller_scope`. Every refusal goes to the audit log.
- :class:`ClusterAuth` (a node agent's API): only the cluster credential, which gateways
  hold and users do not; the scope comes from the gateway's ``x-dsec-project`` header.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
from pathlib import Path

from dsec.api.errors import DSecError, Forbidden, Unauthorized
from dsec.api.projects import check_project_path
from dsec.api.scope import SCOPE_HEADER, caller_scope
from dsec.gateway.projects.roles import allows, needed

__all__ = ["BearerAuth", "ClusterAuth", "load_or_create_token", "OPEN_PATHS", "principal_of"]

OPEN_PATHS = frozenset({"/healthz"})
_SCOPE_KEY = SCOPE_HEADER.encode()


def load_or_create_token(state_dir: Path, name: str = "token") -> tuple[str, bool]:
    """A secret of the state dir (``token``: the root token; ``cluster_token``: the
    credential nodes trust) and whether it was created just now (stored 0600)."""
    path = state_dir / name
    if path.exists():
        return path.read_text().strip(), False
    state_dir.mkdir(parents=True, exist_ok=True)
    token = "dsec_" + secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token, True


def principal_of(request):
    """The :class:`~dsec.gateway.projects.Principal` that made ``request``."""
    return request.scope.get("dsec.principal")


async def _refuse(scope, send, err: DSecError) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 4000 + err.status})
        return
    headers = [(b"content-type", b"application/json")]
    if err.status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": json.dumps(err.to_wire()).encode()})


class BearerAuth:
    """A gateway's authentication and role check; ``projects`` holds the tokens. Paths
    under ``delegated`` prefixes check their callers themselves (the E2B API takes the
    root token in E2B's own headers)."""

    def __init__(self, app, projects, delegated: tuple[str, ...] = ()) -> None:
        self.app, self.projects = app, projects
        self.delegated = tuple(p.rstrip("/") for p in delegated)

    def _open(self, path: str) -> bool:
        return path in OPEN_PATHS or any(path == p or path.startswith(p + "/")
                                         for p in self.delegated)

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or self._open(scope["path"]):
            return await self.app(scope, receive, send)
        got = dict(scope.get("headers") or []).get(b"authorization", b"")
        method = scope.get("method", "GET") if scope["type"] == "http" else "POST"
        try:
            who = self.projects.authenticate(got)
        except Unauthorized as exc:
            self.projects.audit.record("", "unknown", f"{method} {scope['path']}", "",
                                       f"unauthorized: {exc.message}")
            # no hint to a caller with no valid token, beyond why a real one stopped working
            return await _refuse(scope, send, exc)
        need = needed(method, scope["path"])
        if not allows(who.role, who.project, need):
            err = Forbidden(f"a {who.role} token of project {who.project or '(root)'!r} may "
                            f"not {method} {scope['path']}; it needs {need}")
            self.projects.audit.record(who.project, who.who, f"{method} {scope['path']}", "",
                                       f"forbidden: {err.message}")
            return await _refuse(scope, send, err)
        scope["dsec.principal"] = who
        mark = caller_scope.set(None if who.project == "" else who.project)
        try:
            return await self.app(scope, receive, send)
        finally:
            caller_scope.reset(mark)


class ClusterAuth:
    """A node agent's API: the cluster credential only (never a user's token)."""

    def __init__(self, app, token: str, delegated: tuple[str, ...] = ()) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()
        self.delegated = tuple(p.rstrip("/") for p in delegated)

    def _open(self, path: str) -> bool:
        return path in OPEN_PATHS or any(path == p or path.startswith(p + "/")
                                         for p in self.delegated)

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or self._open(scope["path"]):
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        if not hmac.compare_digest(headers.get(b"authorization", b""), self.expected):
            return await _refuse(scope, send, Unauthorized(
                "missing or wrong bearer token (a node's API takes the cluster credential "
                "of its gateways, not a user's token)"))
        project = headers.get(_SCOPE_KEY)
        if project is None:
            return await self.app(scope, receive, send)
        try:
            path = check_project_path(project.decode("utf-8"), SCOPE_HEADER)
        except (ValueError, UnicodeDecodeError) as exc:
            from dsec.api.errors import InvalidArgument
            return await _refuse(scope, send, InvalidArgument(str(exc)))
        mark = caller_scope.set(path)
        try:
            return await self.app(scope, receive, send)
        finally:
            caller_scope.reset(mark)
