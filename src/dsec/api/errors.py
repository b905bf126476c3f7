"""The one exception tree of dsec and the table that maps it to the wire.

Every error raised to a user derives from :class:`DSecError`. Each leaf also inherits the
builtin it resembles, so ``except TimeoutError`` keeps working. The gateway turns an error
into ``{"error": {"code": ..., "message": ...}}`` with the status in :data:`ERROR_TABLE`;
the SDK turns it back with :func:`error_from_wire`.
"""

from __future__ import annotations

__all__ = [
    "DSecError",
    "NotFound",
    "InvalidArgument",
    "TooLarge",
    "Unauthorized",
    "Forbidden",
    "Capacity",
    "QuotaExceeded",
    "SandboxTimeout",
    "SandboxStopped",
    "Unsupported",
    "Conflict",
    "TrajectoryDiverged",
    "Unavailable",
    "NodeLost",
    "RemoteError",
    "Internal",
    "ERROR_TABLE",
    "error_from_wire",
    "shorten",
]


class DSecError(Exception):
    """Root of every dsec error."""

    code = "internal"
    status = 500

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message

    def to_wire(self) -> dict:
        # a message quoting a caller's bad string must still encode as UTF-8
        message = self.message.encode("utf-8", "backslashreplace").decode("utf-8")
        return {"error": {"code": self.code, "message": message}}


class NotFound(DSecError, LookupError):
    """An id, image, tag, path or job does not exist."""

    code, status = "not_found", 404


class InvalidArgument(DSecError, ValueError):
    """A request argument is out of range or malformed."""

    code, status = "invalid_argument", 400


class TooLarge(InvalidArgument):
    """A request body is larger than the node's limit."""

    code, status = "too_large", 413


class Unauthorized(DSecError, PermissionError):
    """A missing or wrong bearer token."""

    code, status = "unauthorized", 401


class Forbidden(DSecError, PermissionError):
    """The token is valid but its role or project may not do this."""

    code, status = "forbidden", 403


class Capacity(DSecError, RuntimeError):
    """The node (or every node) has no room for the request now; retry later or ask for
    less. 429 with ``Retry-After``: a valid request the cluster cannot take yet is not a
    server failure (5xx stays for the server's own)."""

    code, status = "capacity", 429
    retry_after_s = 1


class QuotaExceeded(Capacity):
    """The project (or one above it) has used its quota, and no room came free within the
    request's ``wait_s``; 429 with ``Retry-After``."""

    code, status = "quota_exceeded", 429

    def __init__(self, message: str = "", retry_after_s: float = 1) -> None:
        super().__init__(message)
        self.retry_after_s = max(1, int(retry_after_s + 0.999))


class SandboxTimeout(DSecError, TimeoutError):
    """A command or operation ran past its timeout."""

    code, status = "timeout", 504


class SandboxStopped(DSecError, RuntimeError):
    """The sandbox was stopped or expired."""

    code, status = "stopped", 410


class Unsupported(DSecError, NotImplementedError):
    """The backend does not offer this capability."""

    code, status = "unsupported", 400


class Conflict(DSecError, RuntimeError):
    """The request conflicts with the current state (e.g. a tag being written)."""

    code, status = "conflict", 409


class TrajectoryDiverged(DSecError, RuntimeError):
    """A replayed step differs from the step recorded at the same position."""

    code, status = "trajectory_diverged", 409


class Unavailable(DSecError, ConnectionError):
    """The server (or a node) cannot be reached right now; retrying later may work."""

    code, status = "unavailable", 503


class NodeLost(Unavailable):
    """The node holding the sandbox does not answer; its sandboxes come back with it."""

    code, status = "node_lost", 503


class RemoteError(DSecError, RuntimeError):
    """A called function raised; ``remote_traceback`` is the traceback from the worker."""

    code, status = "remote_error", 500

    def __init__(self, message: str = "", remote_type: str = "",
                 remote_traceback: str = "") -> None:
        super().__init__(message)
        self.remote_type = remote_type
        self.remote_traceback = remote_traceback

    def __str__(self) -> str:
        return f"{self.message}\n\nRemote traceback:\n{self.remote_traceback}"


class Internal(DSecError, RuntimeError):
    """An unexpected failure on the server; the message says where."""

    code, status = "internal", 500


ERROR_TABLE: dict[str, type[DSecError]] = {
    cls.code: cls
    for cls in (NotFound, InvalidArgument, TooLarge, Unauthorized, Forbidden, Capacity,
                QuotaExceeded, SandboxTimeout,
                SandboxStopped, Unsupported, Conflict, TrajectoryDiverged, Unavailable, NodeLost,
                RemoteError, Internal)
}


def error_from_wire(body: object, status: int) -> DSecError:
    """Rebuild the exception a server sent; unknown shapes become :class:`Internal`."""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        err = body["error"]
        cls = ERROR_TABLE.get(str(err.get("code")), Internal)
        return cls(str(err.get("message", "")))
    if status == 401:
        return Unauthorized("missing or wrong bearer token")
    if status == 422 or status == 400:
        return InvalidArgument(str(body))
    return Internal(f"HTTP {status}: {body}")


def shorten(value: object, limit: int = 100) -> str:
    """``value`` as text for an error message, cut to about ``limit`` characters: an id or
    path a caller sent may be megabytes long, and a message echoing it whole buries the
    point (and the logs)."""
    text = str(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text)} characters)"
