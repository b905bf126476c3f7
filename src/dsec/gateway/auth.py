"""Bearer-token authentication, as plain ASGI middleware.

It runs before routing and body parsing, so a wrong or missing token gets 401 whatever the
path, id or body: a caller without the token learns nothing about what exists.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
from pathlib import Path

__all__ = ["BearerAuth", "load_or_create_token", "OPEN_PATHS"]

OPEN_PATHS = frozenset({"/healthz"})


def load_or_create_token(state_dir: Path) -> tuple[str, bool]:
    """The server token and whether it was created just now (stored 0600)."""
    path = state_dir / "token"
    if path.exists():
        return path.read_text().strip(), False
    state_dir.mkdir(parents=True, exist_ok=True)
    token = "dsec_" + secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token, True


class BearerAuth:
    """Every path needs the bearer token, except :data:`OPEN_PATHS` and the paths under
    ``delegated`` prefixes, whose routes check their callers themselves (the E2B API takes
    the same token in E2B's own headers)."""

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
        got = dict(scope.get("headers") or []).get(b"authorization", b"")
        if hmac.compare_digest(got, self.expected):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 4401})
            return
        body = json.dumps({"error": {"code": "unauthorized",
                                     "message": "missing or wrong bearer token"}}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})
