"""File routes: raw bytes in and out, streamed; tar for directories.

A sandbox's protected paths answer 403 unless the token may grade (grader or admin):
:func:`~dsec.gateway.routes.common.reaches_protected`, enforced by the node's file
operations. ``grading`` is how a gateway tells a node's own API; a gateway ignores it.
"""

from __future__ import annotations

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from dsec.api.models import FileInfo, FileList, TarWritten
from dsec.gateway.openapi import raw_answer, raw_body
from dsec.gateway.routes.common import client_for, reaches_protected

__all__ = ["router"]

router = APIRouter(prefix="/v1/sandboxes/{sb_id}/files")

# Not in the OpenAPI document: a gateway ignores it, and only a gateway sets it
_GRADING = Query(False, include_in_schema=False,
                 description="set by a gateway on a node's own API: the caller may grade, so "
                             "protected paths are reached (a gateway takes this from the "
                             "token's role instead)")


@router.get("", response_class=StreamingResponse,
            responses=raw_answer("application/octet-stream", "the file's bytes"))
async def read(request: Request, sb_id: str, path: str = Query(...),
               grading: bool = _GRADING) -> StreamingResponse:
    f = await client_for(request, sb_id).file_read(sb_id, path,
                                                   reaches_protected(request, grading))
    headers = {"content-length": str(f.size)} if f.size is not None else {}
    return StreamingResponse(f.chunks(), media_type="application/octet-stream",
                             headers=headers)


@router.put("", response_model=FileInfo, openapi_extra=raw_body("application/octet-stream"))
async def write(request: Request, sb_id: str, path: str = Query(...),
                mode: int = Query(0o644, ge=0, le=0o7777),
                grading: bool = _GRADING) -> FileInfo:
    return await client_for(request, sb_id).file_write(
        sb_id, path, mode, request.stream(), reaches_protected(request, grading))


@router.get("/stat", response_model=FileInfo)
async def stat(request: Request, sb_id: str, path: str = Query(...),
               grading: bool = _GRADING) -> FileInfo:
    return await client_for(request, sb_id).file_stat(sb_id, path,
                                                      reaches_protected(request, grading))


@router.get("/list", response_model=FileList)
async def list_dir(request: Request, sb_id: str, path: str = Query("/"),
                   grading: bool = _GRADING) -> FileList:
    return FileList(entries=await client_for(request, sb_id).file_list(
        sb_id, path, reaches_protected(request, grading)))


@router.post("/mkdir", response_model=FileInfo)
async def mkdir(request: Request, sb_id: str, path: str = Query(...),
                parents: bool = True, grading: bool = _GRADING) -> FileInfo:
    return await client_for(request, sb_id).file_mkdir(sb_id, path, parents,
                                                       reaches_protected(request, grading))


@router.delete("", status_code=204)
async def remove(request: Request, sb_id: str, path: str = Query(...),
                 recursive: bool = False, grading: bool = _GRADING) -> None:
    await client_for(request, sb_id).file_remove(sb_id, path, recursive,
                                                 reaches_protected(request, grading))


@router.get("/tar", response_class=StreamingResponse,
            responses=raw_answer("application/x-tar", "a tar stream of the path"))
async def download_tar(request: Request, sb_id: str, path: str = Query(...),
                       grading: bool = _GRADING):
    chunks = await client_for(request, sb_id).tar_read(sb_id, path,
                                                       reaches_protected(request, grading))
    return StreamingResponse(chunks, media_type="application/x-tar")


@router.put("/tar", response_model=TarWritten, openapi_extra=raw_body("application/x-tar"))
async def upload_tar(request: Request, sb_id: str, path: str = Query(...),
                     grading: bool = _GRADING) -> TarWritten:
    return TarWritten(entries=await client_for(request, sb_id).tar_write(
        sb_id, path, request.stream(), reaches_protected(request, grading)))
