"""Who may call the E2B API: the API key, each sandbox's envd access token, signed URLs.

The gateway keeps no per-sandbox state, so nothing here is stored: a sandbox's envd access
token names the dsec token it was given to (its id, or ``root``) and is an HMAC of the
sandbox's id and that name under the server token, so any gateway holding the server token
checks it, and envd refuses it once that dsec token is revoked or expires (the caller's
check, :mod:`.envd`). The control plane takes the dsec token as ``X-API-Key`` (what the SDK
sends as ``E2B_API_KEY``); envd calls carry the sandbox's access token as
``X-Access-Token``, as E2B's secured sandboxes do, and file URLs carry E2B's v1 signature
(sha256 over path, operation, user, access token and expiry) instead of any header.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import time

__all__ = ["Keys", "sign_v1", "ROOT"]

ROOT = "root"  # the name of the server's own token in an access token
_WHO = re.compile(r"ea_(root|tok-[0-9a-f]{1,32})\.")


def sign_v1(path: str, operation: str, user: str, token: str,
            expiration: int | None) -> str:
    """E2B's v1 file-URL signature."""
    raw = f"{path}:{operation}:{user}:{token}"
    if expiration is not None:
        raw += f":{expiration}"
    digest = hashlib.sha256(raw.encode()).digest()
    return "v1_" + base64.b64encode(digest).rstrip(b"=").decode("ascii")


class Keys:
    """Checks made with one server token."""

    def __init__(self, token: str) -> None:
        self._token = token.encode()

    def api_key_ok(self, key: str | None) -> bool:
        return key is not None and hmac.compare_digest(key.encode(), self._token)

    def access_token(self, sb_id: str, who: str = ROOT) -> str:
        """The envd access token of ``sb_id`` given to the dsec token ``who`` (an id)."""
        mac = hmac.new(self._token, f"e2b-envd\0{sb_id}\0{who}".encode(), hashlib.sha256)
        return f"ea_{who}.{base64.urlsafe_b64encode(mac.digest()[:24]).decode('ascii')}"

    def access_who(self, sb_id: str, got: str | None) -> str | None:
        """The dsec token ``got`` was given to, if it is an access token of ``sb_id``."""
        got = got or ""
        who = _WHO.match(got)
        if who is None or not hmac.compare_digest(
                got.encode(), self.access_token(sb_id, who.group(1)).encode()):
            return None
        return who.group(1)

    def signature_ok(self, sb_id: str, path: str, operation: str, user: str,
                     signature: str, expiration: int | None,
                     whos: tuple[str, ...] | list[str] = (ROOT,)) -> bool:
        """Whether ``signature`` signs this file operation for ``sb_id`` with the access
        token given to one of ``whos``, and has not expired."""
        if expiration is not None and expiration < time.time():
            return False
        return any(hmac.compare_digest(sign_v1(path, operation, user,
                                               self.access_token(sb_id, who),
                                               expiration).encode(), signature.encode())
                   for who in whos)
