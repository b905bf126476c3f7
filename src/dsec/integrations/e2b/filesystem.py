"""envd's ``filesystem.Filesystem`` service and its ``/files`` HTTP routes on dsec's files.

A relative path is taken from the user's home, as envd does (``/root`` for root, else
``/home/<user>``). Uploads stream to the node, which bounds them by the sandbox's
``disk_mb`` and ``memory_mb``; a write past either is refused with 507 and dsec's message
naming the limit (the SDK raises ``NotEnoughSpaceException``), never cut short.
"""

from __future__ import annotations

import posixpath
import stat as st
from datetime import datetime, timezone

from dsec.api.errors import DSecError, NotFound
from dsec.api.models import ExecRequest, FileInfo, validated
from dsec.integrations.e2b.connect import RpcError, from_dsec
from dsec.integrations.e2b.messages import (EntryInfo, ListDirRequest, MoveRequest,
                                            PathRequest)
from dsec.integrations.e2b.process import Target

__all__ = ["resolve", "entry", "stat", "list_dir", "make_dir", "remove", "move",
           "upload_entry", "space_error"]

_TYPES = {"file": "FILE_TYPE_FILE", "dir": "FILE_TYPE_DIRECTORY",
          "symlink": "FILE_TYPE_SYMLINK", "other": "FILE_TYPE_UNSPECIFIED"}
_LETTER = {"file": "-", "dir": "d", "symlink": "L", "other": "?"}


def resolve(path: str, user: str | None) -> str:
    """An absolute, normalised path; relative ones start at the user's home."""
    if not path.startswith("/"):
        home = "/root" if user in (None, "root", "0") else f"/home/{user}"
        path = f"{home}/{path}"
    return posixpath.normpath(path).replace("//", "/")


def _permissions(kind: str, mode: int) -> str:
    bits = "".join(c if mode & (1 << (8 - i)) else "-" for i, c in enumerate("rwxrwxrwx"))
    return _LETTER[kind] + bits


def entry(info: FileInfo) -> EntryInfo:
    mtime = datetime.fromtimestamp(info.mtime, tz=timezone.utc)
    return EntryInfo(name=info.name, type=_TYPES[info.type], path=info.path, size=info.size,
                     mode=st.S_IMODE(info.mode), permissions=_permissions(info.type,
                                                                          info.mode),
                     modified_time=mtime.isoformat().replace("+00:00", "Z"))


def _wrap(exc: DSecError, target: Target) -> RpcError:
    return from_dsec(exc, target.sb_id)


async def stat(target: Target, req: PathRequest) -> dict:
    try:
        info = await target.client.file_stat(target.sb_id, resolve(req.path, target.user))
    except DSecError as exc:
        raise _wrap(exc, target) from exc
    return {"entry": entry(info).model_dump(by_alias=True, exclude_none=True)}


async def list_dir(target: Target, req: ListDirRequest, max_depth: int) -> dict:
    depth = req.depth or 1
    if depth > max_depth:
        raise RpcError("invalid_argument", f"depth must be at most {max_depth} "
                                           f"(E2BConfig.max_list_depth); got {depth}")
    found: list[EntryInfo] = []
    todo = [(resolve(req.path, target.user), 1)]
    try:
        while todo:
            path, level = todo.pop(0)
            for info in await target.client.file_list(target.sb_id, path):
                found.append(entry(info))
                if info.type == "dir" and level < depth:
                    todo.append((info.path, level + 1))
    except DSecError as exc:
        raise _wrap(exc, target) from exc
    return {"entries": [e.model_dump(by_alias=True, exclude_none=True) for e in found]}


async def make_dir(target: Target, req: PathRequest) -> dict:
    path = resolve(req.path, target.user)
    try:
        await target.client.file_stat(target.sb_id, path)
    except DSecError as exc:
        if exc.code != "not_found" or exc.message.startswith(f"sandbox {target.sb_id}"):
            raise _wrap(exc, target) from exc
    else:
        raise RpcError("already_exists", f"{path} already exists")
    try:
        info = await target.client.file_mkdir(target.sb_id, path, True)
    except DSecError as exc:
        raise _wrap(exc, target) from exc
    return {"entry": entry(info).model_dump(by_alias=True, exclude_none=True)}


async def remove(target: Target, req: PathRequest) -> dict:
    try:
        await target.client.file_remove(target.sb_id, resolve(req.path, target.user), True)
    except DSecError as exc:
        raise _wrap(exc, target) from exc
    return {}


async def move(target: Target, req: MoveRequest) -> dict:
    """A rename in the sandbox (dsec's files API has none: one ``mv``)."""
    src, dst = resolve(req.source, target.user), resolve(req.destination, target.user)
    try:
        await target.client.file_stat(target.sb_id, src)
        await _not_protected(target, dst)
        out = await target.client.exec(target.sb_id, validated(
            ExecRequest, cmd=["mv", "--", src, dst], timeout=60, max_output=1 << 16))
        if out.exit_code != 0:
            raise RpcError("invalid_argument", f"moving {src} to {dst}: {out.stderr.strip()}")
        info = await target.client.file_stat(target.sb_id, dst)
    except DSecError as exc:
        raise _wrap(exc, target) from exc
    return {"entry": entry(info).model_dump(by_alias=True, exclude_none=True)}


async def _not_protected(target: Target, path: str) -> None:
    """Forbidden if ``path`` is (or is under) a protected path: a stat says so before a
    ``mv`` would run into Landlock with a bare "Permission denied"."""
    try:
        await target.client.file_stat(target.sb_id, path)
    except NotFound as exc:
        if exc.message.startswith(f"sandbox {target.sb_id}"):
            raise


def upload_entry(info: FileInfo) -> dict:
    """One item of the ``POST /files`` answer."""
    return {"path": info.path, "name": info.name,
            "type": "dir" if info.type == "dir" else "file"}


def space_error(exc: DSecError) -> bool:
    """Whether a refused write ran into the sandbox's disk or memory limit."""
    return exc.code == "invalid_argument" and ("disk_mb=" in exc.message
                                                or "memory_mb=" in exc.message)
