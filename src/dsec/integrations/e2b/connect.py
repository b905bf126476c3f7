"""The server half of Connect RPC (connectrpc.com/docs/protocol) that envd's clients use.

Unary calls are a JSON body in and a JSON body out (``application/json``); a failure is an
HTTP status with ``{"code": "<connect code>", "message": ...}``. A server stream reads one
enveloped request (``application/connect+json``: a flags byte, a 4-byte big-endian length,
the JSON) and answers 200 with enveloped messages, then an end-of-stream envelope (flag
0x02) holding ``{}`` or ``{"error": {...}}``.

Decision: only the JSON codec. The e2b SDK sends JSON (its codec is named "json", as the
JS SDK's ``useBinaryFormat: false``); a request in the binary protobuf codec is answered
with 415 naming the codec to use, rather than a second, untested wire format.
"""

from __future__ import annotations

import json
import struct
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from dsec.api.errors import DSecError
from dsec.api.models import describe

__all__ = ["RpcError", "STATUS", "from_dsec", "parse_unary", "parse_stream_request",
           "parse_client_stream",
           "unary_response", "error_response", "envelope", "end_stream", "stream_body",
           "timeout_s", "STREAM_TYPE"]

STREAM_TYPE = "application/connect+json"
END_STREAM = 0x02

# Connect code -> HTTP status (the protocol's own table)
STATUS = {
    "canceled": 499, "unknown": 500, "invalid_argument": 400, "deadline_exceeded": 504,
    "not_found": 404, "already_exists": 409, "permission_denied": 403,
    "resource_exhausted": 429, "failed_precondition": 400, "aborted": 409,
    "out_of_range": 400, "unimplemented": 501, "internal": 500, "unavailable": 503,
    "data_loss": 500, "unauthenticated": 401,
}

# dsec wire code -> Connect code
_FROM_DSEC = {
    "not_found": "not_found", "invalid_argument": "invalid_argument",
    "too_large": "out_of_range", "unauthorized": "unauthenticated",
    "capacity": "resource_exhausted", "sandbox_timeout": "deadline_exceeded",
    "sandbox_stopped": "unavailable", "unsupported": "unimplemented",
    "conflict": "failed_precondition", "unavailable": "unavailable",
    "node_lost": "unavailable", "forbidden": "permission_denied",
}


class RpcError(Exception):
    """A Connect error: one of :data:`STATUS`'s codes and a message saying what to change."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message

    def to_wire(self) -> dict:
        return {"code": self.code, "message": self.message}


def from_dsec(exc: DSecError, sb_id: str | None = None) -> RpcError:
    """The Connect error for a dsec error. A sandbox that does not exist (any more) is
    ``unavailable`` with "was not found" in the message: what E2B's proxy answers, and
    what the SDK turns into ``SandboxNotRunningException``."""
    if sb_id and exc.code in ("not_found", "sandbox_stopped") \
            and exc.message.startswith(f"sandbox {sb_id}"):
        return RpcError("unavailable", f"sandbox {sb_id} was not found: {exc.message}")
    return RpcError(_FROM_DSEC.get(exc.code, "internal"), exc.message)


def _check_type(request: Request, expected: str) -> None:
    got = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if got != expected:
        raise RpcError("invalid_argument",
                       f"dsec's envd speaks Connect with the JSON codec: send content-type "
                       f"{expected}; got {got or 'none'}")


def _model(cls: type[BaseModel], data: bytes) -> BaseModel:
    try:
        return cls.model_validate_json(data or b"{}")
    except ValidationError as exc:
        raise RpcError("invalid_argument", f"{cls.__name__}: {describe(exc)}") from None


async def parse_unary(request: Request, cls: type[BaseModel]) -> BaseModel:
    """The request message of a unary call."""
    _check_type(request, "application/json")
    return _model(cls, await request.body())


async def parse_stream_request(request: Request, cls: type[BaseModel]) -> BaseModel:
    """The one request message of a server-streaming call."""
    _check_type(request, STREAM_TYPE)
    body = await request.body()
    if len(body) < 5:
        raise RpcError("invalid_argument", "a streaming request needs one enveloped message "
                                           "(flags byte, 4-byte length, JSON)")
    flags, size = struct.unpack(">BI", body[:5])
    if flags & 0x01:
        raise RpcError("invalid_argument", "compressed messages are not accepted: send "
                                           "them uncompressed")
    if len(body) != 5 + size:
        raise RpcError("invalid_argument", f"the envelope says {size} bytes but "
                                           f"{len(body) - 5} followed")
    return _model(cls, body[5:])


async def parse_client_stream(request: Request, cls: type[BaseModel],
                              max_message: int = 4 << 20) -> AsyncIterator[BaseModel]:
    """The messages of a client stream, each as soon as its envelope is whole."""
    _check_type(request, STREAM_TYPE)
    buf = bytearray()
    async for chunk in request.stream():
        buf += chunk
        while len(buf) >= 5:
            flags, size = struct.unpack(">BI", buf[:5])
            if size > max_message:
                raise RpcError("resource_exhausted", f"a message of {size} bytes is over "
                                                     f"the {max_message} accepted: send "
                                                     "smaller chunks")
            if len(buf) < 5 + size:
                break
            data, buf = bytes(buf[5:5 + size]), buf[5 + size:]
            if flags & 0x01:
                raise RpcError("invalid_argument", "compressed messages are not accepted: "
                                                   "send them uncompressed")
            if flags & END_STREAM:
                return
            yield _model(cls, data)
    if buf:
        raise RpcError("invalid_argument", f"the stream ended inside an envelope "
                                           f"({len(buf)} bytes left over)")


def unary_response(message: BaseModel | dict) -> Response:
    if isinstance(message, BaseModel):
        body = message.model_dump_json(by_alias=True, exclude_none=True)
        return Response(body, media_type="application/json")
    return JSONResponse(message)


def error_response(err: RpcError) -> JSONResponse:
    return JSONResponse(err.to_wire(), status_code=STATUS.get(err.code, 500))


def envelope(message: BaseModel | dict) -> bytes:
    if isinstance(message, BaseModel):
        data = message.model_dump_json(by_alias=True, exclude_none=True).encode()
    else:
        data = json.dumps(message, separators=(",", ":")).encode()
    return struct.pack(">BI", 0, len(data)) + data


def end_stream(err: RpcError | None = None) -> bytes:
    data = json.dumps({"error": err.to_wire()} if err else {}).encode()
    return struct.pack(">BI", END_STREAM, len(data)) + data


def timeout_s(request: Request) -> float | None:
    """The call's deadline (``Connect-Timeout-Ms``) in seconds, or None for none."""
    raw = request.headers.get("connect-timeout-ms")
    if raw is None:
        return None
    if not raw.isdigit() or len(raw) > 10:
        raise RpcError("invalid_argument", f"Connect-Timeout-Ms must be a positive integer of "
                                           f"at most 10 digits; got {raw[:20]!r}")
    return int(raw) / 1000 or None


async def stream_body(messages: AsyncIterator[bytes],
                      sb_id: str | None = None) -> AsyncIterator[bytes]:
    """Envelopes as they come; an error raised on the way ends the stream with it."""
    try:
        async for chunk in messages:
            yield chunk
    except RpcError as err:
        yield end_stream(err)
        return
    except DSecError as exc:
        yield end_stream(from_dsec(exc, sb_id))
        return
    yield end_stream()
