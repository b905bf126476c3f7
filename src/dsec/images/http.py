"""HTTP face of a layer store, for nodes that load layers on demand.

``blob_router(svc)`` returns a FastAPI router the gateway mounts:

- ``GET /v1/blobs/{digest}``: the blob's bytes; honours ``Range`` (206 partial content).
- ``GET /v1/blobs/{digest}/chunks``: the chunk table (raw sha256 of each 256 KiB chunk,
  concatenated); a client checks it against the manifest's ``chunks`` digest and then
  every chunk it fetches against the table. Computing it re-hashes the whole blob, so a
  corrupted blob is refused here too (500, code ``internal``).
- ``GET /v1/manifests/{name}``: the manifest JSON, byte for byte, by tag or digest; its
  digest in the ``Dsec-Content-Digest`` header.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from fastapi import APIRouter
from fastapi.responses import FileResponse, JSONResponse, Response

from dsec.api.errors import DSecError
from dsec.images.store import CorruptBlob, hash_blob

if TYPE_CHECKING:
    from dsec.images.service import ImageService

__all__ = ["blob_router", "DIGEST_HEADER"]

DIGEST_HEADER = "Dsec-Content-Digest"


def blob_router(svc: ImageService) -> APIRouter:
    """A router serving ``svc``'s blobs and manifests (see module docstring)."""
    router = APIRouter()
    tables: dict[tuple[str, float], bytes] = {}
    lock = threading.Lock()

    def _error(exc: DSecError) -> JSONResponse:
        return JSONResponse(exc.to_wire(), status_code=exc.status)

    @router.get("/v1/blobs/{digest}")
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

    @router.get("/v1/blobs/{digest}/chunks")
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

    @router.get("/v1/manifests/{name:path}")
    def get_manifest(name: str) -> Response:
        try:
            digest = svc.manifest_digest(name)
            data = svc.store.manifest_bytes(digest)
        except DSecError as exc:
            return _error(exc)
        return Response(data, media_type="application/json", headers={DIGEST_HEADER: digest})

    return router
