"""HTTP face of a layer store, for nodes that load layers on demand.

``blob_router(svc)`` returns a FastAPI router the gateway mounts:

- ``GET /v1/blobs/{digest}``: the blob's bytes; honours ``Range`` (206 partial content).
- ``GET /v1/blobs/{digest}/chunks``: the chunk table (raw sha256 of each 256 KiB chunk,
  concatenated); a client checks it against the manifest's ``chunks`` digest and then
  every chunk it fetches against the table. Computing it re-hashes the whole blob, so a
  corrupted blob is refused here too (500, code ``internal``).
- ``GET /v1/manifests/{name}``: the manifest JSON, byte for byte, by tag or digest; its
  digest in the ``Dsec-Content-Digest`` header, and for a project's snapshot tag (seen
  only by that project's tokens, those above it and the root's) the project in
  ``Dsec-Project``.
- ``HEAD /v1/blobs/{digest}``, ``PUT /v1/blobs/{digest}`` (body: the blob; refused unless
  it hashes to ``digest``) and ``PUT /v1/manifests/{name}`` (refused unless every layer it
  lists is present; tags ``name`` unless it is a digest): how a node pushes what it built.

The router has no authentication of its own: the gateway includes it behind its bearer
token dependency.
"""

from __future__ import annotations

import shutil
import threading
from typing import TYPE_CHECKING

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, JSONResponse, Response
from pydantic import BaseModel

from dsec.api.errors import DSecError, InvalidArgument, NotFound
from dsec.images.models import LayerRef, Manifest
from dsec.images.refs import check_digest, is_digest
from dsec.images.remote import PROJECT_HEADER
from dsec.images.store import CorruptBlob, hash_blob

if TYPE_CHECKING:
    from dsec.images.service import ImageService

__all__ = ["blob_router", "DIGEST_HEADER"]

DIGEST_HEADER = "Dsec-Content-Digest"
MAX_MANIFEST = 1 << 20

# How the document describes the routes that take or answer bytes (FastAPI sees neither).
_BYTES = {"content": {"application/octet-stream": {"schema": {"type": "string",
                                                               "format": "binary"}}}}


class ManifestPushed(BaseModel):
    """A manifest the store took: its digest."""

    digest: str


def blob_router(svc: ImageService) -> APIRouter:
    """A router serving ``svc``'s blobs and manifests (see module docstring)."""
    router = APIRouter()
    tables: dict[tuple[str, float], bytes] = {}
    lock = threading.Lock()

    def _error(exc: DSecError) -> JSONResponse:
        return JSONResponse(exc.to_wire(), status_code=exc.status)

    @router.get("/v1/blobs/{digest}", response_class=Response, responses={
        200: {"description": "the blob", **_BYTES},
        206: {"description": "the part of the blob a Range header asked for", **_BYTES}})
    def get_blob(digest: str) -> Response:
        try:
            path = svc.store.blob_path(digest)
        except DSecError as exc:
            return _error(exc)
        if not path.is_file():
            return JSONResponse({"error": {"code": "not_found",
                                           "message": f"layer {digest} not found"}}, 404)
        return FileResponse(path, media_type="application/octet-stream",
                            headers={DIGEST_HEADER: digest})

    @router.get("/v1/blobs/{digest}/chunks", response_class=Response,
                responses={200: {"description": "the chunk table", **_BYTES}})
    def get_chunks(digest: str) -> Response:
        try:
            path = svc.store.blob_path(digest)
            key = (digest, path.stat().st_mtime)
            with lock:
                table = tables.get(key)
            if table is None:
                actual, table = hash_blob(path)
                if actual != digest:
                    raise CorruptBlob(f"layer {digest} is corrupted on the server "
                                      f"(hashes to {actual}); refusing to serve it")
                with lock:
                    tables[key] = table
        except FileNotFoundError:
            return JSONResponse({"error": {"code": "not_found",
                                           "message": f"layer {digest} not found"}}, 404)
        except DSecError as exc:
            return _error(exc)
        return Response(table, media_type="application/octet-stream")

    @router.head("/v1/blobs/{digest}", response_class=Response,
                 responses={200: {"description": "the store has the blob"},
                            404: {"description": "the store does not have it"}})
    def head_blob(digest: str) -> Response:
        try:
            ok = svc.store.has_blob(digest)
        except DSecError as exc:
            return _error(exc)
        return Response(status_code=200 if ok else 404)

    @router.put("/v1/blobs/{digest}", status_code=201, response_model=LayerRef,
                openapi_extra={"requestBody": {"required": True, **_BYTES}})
    async def put_blob(digest: str, request: Request) -> Response:
        try:
            check_digest(digest)
            tmp = svc.store.tempdir("upload-") / "blob"
            try:
                with open(tmp, "wb") as f:
                    async for block in request.stream():
                        f.write(block)
                ref = await run_in_threadpool(svc.store.add_blob_file, tmp, digest)
            finally:
                shutil.rmtree(tmp.parent, ignore_errors=True)
        except DSecError as exc:
            return _error(exc)
        return JSONResponse(ref.model_dump(), status_code=201)

    @router.put("/v1/manifests/{name:path}", status_code=201, response_model=ManifestPushed,
                openapi_extra={"requestBody": {"required": True, "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/Manifest"}}}}})
    async def put_manifest(name: str, request: Request) -> Response:
        data = await request.body()
        try:
            if len(data) > MAX_MANIFEST:
                raise InvalidArgument(f"manifest of {len(data)} bytes; at most {MAX_MANIFEST}")
            try:
                manifest = Manifest.model_validate_json(data)
            except ValueError as exc:
                raise InvalidArgument(f"not a dsec manifest: {exc}") from exc
            for lr in manifest.layers:
                if not svc.store.has_blob(lr.digest):
                    raise NotFound(f"manifest names layer {lr.digest}, which is not here; "
                                   f"push the layer first")
            digest = svc.store.put_manifest_bytes(data)
            if is_digest(name):
                if name != digest:
                    raise InvalidArgument(f"manifest hashes to {digest}, not {name}")
            else:
                svc.store.set_tag(name, digest)
        except DSecError as exc:
            return _error(exc)
        return JSONResponse(ManifestPushed(digest=digest).model_dump(), status_code=201,
                            headers={DIGEST_HEADER: digest})

    @router.get("/v1/manifests/{name:path}", response_model=Manifest)
    def get_manifest(name: str) -> Response:
        try:
            digest = svc.manifest_digest(name)  # a tag the caller may not see: NotFound
            data = svc.store.manifest_bytes(digest)
            record = None if is_digest(name) else svc.store.tag_record(name)
        except DSecError as exc:
            return _error(exc)
        headers = {DIGEST_HEADER: digest}
        if record is not None and record[1] is not None:  # a node pulling it keeps it theirs
            headers[PROJECT_HEADER] = record[1]
        return Response(data, media_type="application/json", headers=headers)

    return router
