"""Who may call the E2B API: the API key, each sandbox's envd access token, signed URLs.

The gateway keeps no per-sandbox state, so nothing here is stored: a sandbox's envd access
token is an HMAC of its id under the server token, and any gateway holding the token
derives the same one. The control plane takes the dsec token as ``X-API-Key`` (what the SDK
sends as ``E2B_API_KEY``); envd calls carry the sandbox's access token as
``X-Access-Token``, as E2B's secured sandboxes do, and file URLs carry E2B's v1 signature
(sha256 over path, operation, user, access token and expiry) instead of any header.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time

__all__ = ["Keys", "sign_v1"]


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

    def access_token(self, sb_id: str) -> str:
        mac = hmac.new(self._token, b"e2b-envd\0" + sb_id.encode(), hashlib.sha256)
        return "ea_" + base64.urlsafe_b64encode(mac.digest()[:24]).decode("ascii")

    def access_ok(self, sb_id: str, got: str | None) -> bool:
        return got is not None and hmac.compare_digest(got.encode(),
                                                       self.access_token(sb_id).encode())

    def signature_ok(self, sb_id: str, path: str, operation: str, user: str,
                     signature: str, expiration: int | None) -> bool:
        """Whether ``signature`` signs this file operation for ``sb_id`` and has not expired."""
        if expiration is not None and expiration < time.time():
            return False
        want = sign_v1(path, operation, user, self.access_token(sb_id), expiration)
        return hmac.compare_digest(want.encode(), signature.encode())
