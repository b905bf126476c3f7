"""The envd side (``E2B_SANDBOX_URL=<dsec>/e2b/envd``): commands and files of one sandbox.

E2B reaches each sandbox's own envd at its own host name; with ``E2B_SANDBOX_URL`` set the
SDK sends every sandbox's calls to one URL and names the sandbox in ``E2b-Sandbox-Id``,
which is what routes here. A call must carry that sandbox's access token
(``X-Access-Token``, from create or connect), and the dsec token it was given to must still
work (not revoked or expired); a file URL from ``download_url`` / ``upload_url`` carries a
signature instead and no header, and its sandbox is the one whose token signs it (one
given to a dsec token that still works). The user, when the SDK names one, comes as
``Authorization: Basic``.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel

from dsec.api.errors import DSecError
from dsec.api.projects import ancestors
from dsec.gateway.routes.common import client_for, gateway_of, next_while, recheck
from dsec.gateway.spread import list_all
from dsec.integrations.e2b import filesystem as fs
from dsec.integrations.e2b import process, watch
from dsec.integrations.e2b.auth import ROOT, Keys
from dsec.integrations.e2b.config import E2BConfig
from dsec.integrations.e2b.connect import (STREAM_TYPE, RpcError, end_stream, envelope,
                                           error_response, from_dsec, parse_client_stream,
                                           parse_stream_request, parse_unary, stream_body,
                                           timeout_s, unary_response)
from dsec.integrations.e2b.messages import (CloseStdinRequest, ConnectRequest, Empty,
                                            ListDirRequest, MoveRequest, PathRequest,
                                            SendInputRequest, SendSignalRequest, StartRequest,
                                            StreamInputRequest, UpdateRequest, WatcherRequest,
                                            WatchRequest)
from dsec.integrations.e2b.process import Target, decode_user

__all__ = ["envd_router", "envd_fallback_router", "signed_files_router", "SIGNED_FILES"]

PREFIX = "/e2b/envd"
_V1 = re.compile(r"v1_[A-Za-z0-9+/]{43}")  # E2B's v1 signature: sha256, base64 unpadded
SIGNED_FILES = "/files"


def _keys(request: Request) -> Keys:
    return request.app.state.e2b_keys


def _target(request: Request) -> Target:
    """The sandbox a call names, once its access token checks out."""
    sb_id = request.headers.get("e2b-sandbox-id")
    if not sb_id:
        raise RpcError("invalid_argument", "name the sandbox in the E2b-Sandbox-Id header (the "
                                           "e2b SDK does when E2B_SANDBOX_URL is set)")
    who = _keys(request).access_who(sb_id, request.headers.get("x-access-token"))
    if who is None:
        raise RpcError("unauthenticated", f"missing or wrong X-Access-Token for sandbox {sb_id}: "
                                          "use the envdAccessToken that create or connect gave")
    projects = gateway_of(request).projects
    request.state.e2b_who = who
    if who != ROOT and projects is not None and not projects.store.live(who):
        raise RpcError("unauthenticated", f"the X-Access-Token of sandbox {sb_id} was given to "
                                          f"the dsec token {who}, which was revoked, expired or "
                                          "lost its project: connect again with a working "
                                          "E2B_API_KEY for a new one")
    try:
        client = client_for(request, sb_id)
    except DSecError as exc:
        raise from_dsec(exc, sb_id) from exc
    return Target(sb_id, client, decode_user(request.headers.get("authorization")))


async def _while_live(request: Request, events: AsyncIterator[bytes]
                      ) -> AsyncIterator[bytes]:
    """``events`` until they end, or until the dsec token the call's access token was given
    to stops working (asked every RECHECK_S): then ``unauthenticated``, as a revoked
    token's dsec stream ends (the command goes on, as when a client leaves)."""
    projects, who = gateway_of(request).projects, request.state.e2b_who
    valid = None if who == ROOT or projects is None else recheck(
        lambda: projects.store.live(who))
    while True:
        try:
            chunk = await next_while(events, valid)
        except StopAsyncIteration:
            return
        yield chunk


def _unary(cls: type[BaseModel], fn: Callable[[Target, BaseModel], Awaitable[object]]):
    async def route(request: Request) -> Response:
        target = None
        try:
            target = _target(request)
            return unary_response(await fn(target, await parse_unary(request, cls)) or {})
        except RpcError as err:
            return error_response(err)
        except DSecError as exc:
            return error_response(from_dsec(exc, target.sb_id if target else None))
    return route


def _stream_error(err: RpcError) -> Response:
    return Response(end_stream(err), media_type=STREAM_TYPE)


def envd_router(config: E2BConfig) -> APIRouter:
    """The routes under ``/e2b/envd``."""
    router = APIRouter(prefix=PREFIX, include_in_schema=False)

    async def process_stream(request: Request, model, make_events) -> Response:
        """Start and Connect: a command's event stream, or the stream's error frame."""
        try:
            target = _target(request)
            msg = await parse_stream_request(request, model)
            events = make_events(target, msg, timeout_s(request), config.max_output_bytes,
                                 _keepalive(request))
        except RpcError as err:
            return _stream_error(err)
        return StreamingResponse(stream_body(_while_live(request, events), target.sb_id),
                                 media_type=STREAM_TYPE)

    @router.post("/process.Process/Start")
    async def start(request: Request) -> Response:
        return await process_stream(request, StartRequest, process.start_events)

    @router.post("/process.Process/Connect")
    async def connect(request: Request) -> Response:
        return await process_stream(request, ConnectRequest, process.connect_events)

    @router.post("/filesystem.Filesystem/WatchDir")
    async def watch_dir(request: Request) -> Response:
        try:
            target = _target(request)
            msg = await parse_stream_request(request, WatchRequest)
            events = watch.watch_events(target, msg, config.watch_interval_s,
                                        _keepalive(request), timeout_s(request))
        except RpcError as err:
            return _stream_error(err)
        return StreamingResponse(stream_body(_while_live(request, events), target.sb_id),
                                 media_type=STREAM_TYPE)

    @router.post("/process.Process/StreamInput")
    async def stream_input(request: Request) -> Response:
        target = None
        try:
            target = _target(request)
            await process.stream_input(target, parse_client_stream(request,
                                                                   StreamInputRequest))
        except RpcError as err:
            return _stream_error(err)
        except DSecError as exc:
            return _stream_error(from_dsec(exc, target.sb_id if target else None))
        return Response(envelope({}) + end_stream(), media_type=STREAM_TYPE)

    unary = {
        "process.Process/List": (Empty, lambda t, m: process.list_processes(t)),
        "process.Process/SendSignal": (SendSignalRequest, process.send_signal),
        "process.Process/SendInput": (SendInputRequest, process.send_input),
        "process.Process/CloseStdin": (CloseStdinRequest, process.close_stdin),
        "process.Process/Update": (UpdateRequest, process.update),
        "filesystem.Filesystem/Stat": (PathRequest, fs.stat),
        "filesystem.Filesystem/CreateWatcher": (WatchRequest, watch.create_watcher),
        "filesystem.Filesystem/GetWatcherEvents": (WatcherRequest, watch.watcher_events),
        "filesystem.Filesystem/RemoveWatcher": (WatcherRequest, watch.remove_watcher),
        "filesystem.Filesystem/MakeDir": (PathRequest, fs.make_dir),
        "filesystem.Filesystem/Remove": (PathRequest, fs.remove),
        "filesystem.Filesystem/Move": (MoveRequest, fs.move),
        "filesystem.Filesystem/ListDir": (
            ListDirRequest, lambda t, m: fs.list_dir(t, m, config.max_list_depth)),
    }
    for path, (cls, fn) in unary.items():
        router.post(f"/{path}")(_unary(cls, fn))

    router.get("/health")(_health)
    router.get("/files")(_download)
    router.post("/files")(_upload)
    return router


def envd_fallback_router() -> APIRouter:
    """Any other envd path: Connect's ``unimplemented``, in Connect's shape."""
    router = APIRouter(prefix=PREFIX, include_in_schema=False)

    @router.api_route("/{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    async def unserved(request: Request, rest: str) -> Response:
        return error_response(RpcError("unimplemented", f"dsec's envd does not serve "
                                                         f"{request.method} /{rest}"))

    return router


def signed_files_router() -> APIRouter:
    """``/files`` at the server's root, for signed URLs only: the SDK builds
    ``download_url``/``upload_url`` with ``urljoin(E2B_SANDBOX_URL, "/files")``, which drops
    the ``/e2b/envd`` path. A request here without a signature is refused."""
    router = APIRouter(include_in_schema=False)

    async def signed_only(request: Request, route) -> Response:
        if "signature" not in request.query_params:
            return _http_error(401, "/files takes signed URLs only (from download_url or "
                                    "upload_url); other calls go to /e2b/envd/files")
        return await route(request)

    @router.get(SIGNED_FILES)
    async def download(request: Request) -> Response:
        return await signed_only(request, _download)

    @router.post(SIGNED_FILES)
    async def upload(request: Request) -> Response:
        return await signed_only(request, _upload)

    return router


def _keepalive(request: Request) -> float | None:
    raw = request.headers.get("keepalive-ping-interval", "")
    return float(raw) if raw.isdigit() and 0 < int(raw) <= 3600 else None


# ---- plain HTTP: health and file contents ----

def _http_error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status)


def _http_from(err: RpcError) -> JSONResponse:
    # what envd (or E2B's proxy, for a sandbox that is gone: 502) answers for each
    status = {"unavailable": 502, "invalid_argument": 400, "unauthenticated": 401,
              "not_found": 404, "out_of_range": 400, "permission_denied": 403, "already_exists": 409,
              "resource_exhausted": 429, "unimplemented": 501}.get(err.code, 500)
    return _http_error(status, err.message)


async def _health(request: Request) -> Response:
    try:
        target = _target(request)
        info = await target.client.get(target.sb_id)
    except RpcError as err:
        return _http_from(err)
    except DSecError as exc:
        return _http_from(from_dsec(exc, request.headers.get("e2b-sandbox-id")))
    if info.state not in ("running", "paused", "starting"):
        return _http_error(502, f"sandbox {info.id} was not found (it is {info.state})")
    return Response(status_code=204)


async def _file_target(request: Request, operation: str) -> tuple[Target, str]:
    """The sandbox and the absolute path of a ``/files`` call: by header and token, or by
    the signature of a URL from ``download_url`` / ``upload_url``."""
    q = request.query_params
    path, user, signature = q.get("path"), q.get("username"), q.get("signature")
    if not path:
        raise RpcError("invalid_argument", "the path query parameter is required")
    if signature is None:
        target = _target(request)
    else:
        expiration = q.get("signature_expiration")
        if expiration is not None and not expiration.isdigit():
            raise RpcError("invalid_argument", "signature_expiration must be a Unix time")
        exp = int(expiration) if expiration is not None else None
        sb_id = request.headers.get("e2b-sandbox-id") or await _signed_by(
            request, path, operation, user or "", signature, exp)
        if sb_id is None or not _keys(request).signature_ok(
                sb_id, path, operation, user or "", signature, exp,
                await _signers_of(request, sb_id)):
            raise RpcError("unauthenticated", f"the signature does not allow {operation} of "
                                              f"{path} (wrong, or expired): get a new URL")
        try:
            client = client_for(request, sb_id)
        except DSecError as exc:
            raise from_dsec(exc, sb_id) from exc
        target = Target(sb_id, client, user)
    if user:
        target.user = user
    return target, fs.resolve(path, target.user)


async def _signed_by(request: Request, path: str, operation: str, user: str, signature: str,
                     expiration: int | None) -> str | None:
    """The sandbox whose access token made ``signature``: a bare URL names no sandbox, and
    the gateway stores none, so each listed sandbox's token is tried (one HMAC and one
    sha256 each: about 2 µs, so 10,000 sandboxes cost 20 ms)."""
    keys = _keys(request)
    if not _V1.fullmatch(signature):  # not worth asking every node about
        return None
    found = await list_all(gateway_of(request))
    signers: dict[str, list[str]] = {}
    for info in found.sandboxes:
        if info.project not in signers:
            signers[info.project] = _signers(request, info.project)
        if keys.signature_ok(info.id, path, operation, user, signature, expiration,
                             signers[info.project]):
            return info.id
    return None


def _signers(request: Request, project: str) -> list[str]:
    """Whose access tokens of a sandbox of ``project`` may sign its file URLs: the root's,
    and the working tokens (user and above) of the project and those above it."""
    projects = gateway_of(request).projects
    if projects is None:
        return [ROOT]
    return [ROOT, *projects.store.live_ids(ancestors(project), ("user", "grader", "admin"))]


async def _signers_of(request: Request, sb_id: str) -> list[str]:
    if gateway_of(request).projects is None:
        return [ROOT]
    try:
        info = await client_for(request, sb_id).get(sb_id)
    except DSecError:
        return []  # no such sandbox: nothing signs for it
    return _signers(request, info.project)


async def _download(request: Request) -> Response:
    try:
        target, path = await _file_target(request, "read")
        f = await target.client.file_read(target.sb_id, path)
    except RpcError as err:
        return _http_from(err)
    except DSecError as exc:
        return _http_from(from_dsec(exc, request.headers.get("e2b-sandbox-id")))
    headers = {"content-length": str(f.size)} if f.size is not None else {}
    return StreamingResponse(f.chunks(), media_type="application/octet-stream",
                             headers=headers)


async def _upload(request: Request) -> Response:
    target = None
    try:
        target, path = await _file_target(request, "write")
        kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
        if kind == "multipart/form-data":
            written = await _upload_multipart(request, target, path)
        else:
            body = request.stream()
            if request.headers.get("content-encoding", "").lower() == "gzip":
                body = _gunzip(body)
            written = [await target.client.file_write(target.sb_id, path, 0o644, body)]
    except RpcError as err:
        return _http_from(err)
    except DSecError as exc:
        if fs.space_error(exc):
            return _http_error(507, exc.message)
        return _http_from(from_dsec(exc, target.sb_id if target else None))
    return JSONResponse([fs.upload_entry(info) for info in written])


async def _upload_multipart(request: Request, target: Target, path: str) -> list:
    form = await request.form()
    try:
        files = [v for k, v in form.multi_items() if k == "file" and hasattr(v, "read")]
        if not files:
            raise RpcError("invalid_argument", "the multipart body holds no 'file' part")
        written = []
        for upload in files:
            dest = path if len(files) == 1 else fs.resolve(upload.filename or "", target.user)
            written.append(await target.client.file_write(target.sb_id, dest, 0o644,
                                                          _chunks(upload)))
        return written
    finally:
        await form.close()


async def _chunks(upload) -> AsyncIterator[bytes]:
    while chunk := await upload.read(1 << 20):
        yield chunk


async def _gunzip(body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    z = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        async for chunk in body:
            if out := z.decompress(chunk):
                yield out
        if tail := z.flush():
            yield tail
    except zlib.error as exc:
        raise RpcError("invalid_argument", f"the gzip body does not decompress: {exc}") from None
