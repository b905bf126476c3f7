"""File routes: raw bytes in and out, streamed; tar for directories."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from dsec.api.models import FileInfo, FileList
from dsec.gateway.routes.common import client_for

__all__ = ["router"]

router = APIRouter(prefix="/v1/sandboxes/{sb_id}/files")


@router.get("", response_class=StreamingResponse)
async def read(request: Request, sb_id: str, path: str = Query(...)) -> StreamingResponse:
    f = await client_for(request, sb_id).file_read(sb_id, path)
    headers = {"content-length": str(f.size)} if f.size is not None else {}
    return StreamingResponse(f.chunks(), media_type="application/octet-stream",
                             headers=headers)


@router.put("", response_model=FileInfo)
async def write(request: Request, sb_id: str, path: str = Query(...),
                mode: int = Query(0o644, ge=0, le=0o7777)) -> FileInfo:
    return await client_for(request, sb_id).file_write(sb_id, path, mode, request.stream())


@router.get("/stat", response_model=FileInfo)
async def stat(request: Request, sb_id: str, path: str = Query(...)) -> FileInfo:
    return await client_for(request, sb_id).file_stat(sb_id, path)


@router.get("/list", response_model=FileList)
async def list_dir(request: Request, sb_id: str, path: str = Query("/")) -> FileList:
    return FileList(entries=await client_for(request, sb_id).file_list(sb_id, path))


@router.post("/mkdir", response_model=FileInfo)
async def mkdir(request: Request, sb_id: str, path: str = Query(...),
                parents: bool = True) -> FileInfo:
    return await client_for(request, sb_id).file_mkdir(sb_id, path, parents)


@router.delete("", status_code=204)
async def remove(request: Request, sb_id: str, path: str = Query(...),
                 recursive: bool = False) -> None:
    await client_for(request, sb_id).file_remove(sb_id, path, recursive)


@router.get("/tar", response_class=StreamingResponse)
async def download_tar(request: Request, sb_id: str, path: str = Query(...)):
    chunks = await client_for(request, sb_id).tar_read(sb_id, path)
    return StreamingResponse(chunks, media_type="application/x-tar")


@router.put("/tar")
async def upload_tar(request: Request, sb_id: str, path: str = Query(...)) -> dict:
    return {"entries": await client_for(request, sb_id).tar_write(sb_id, path,
                                                                   request.stream())}
