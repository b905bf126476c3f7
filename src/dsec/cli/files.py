"""``dsec cp``: copy files and directories between this machine and a sandbox."""

from __future__ import annotations

import posixpath
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer

import dsec
from dsec.api.errors import NotFound
from dsec.cli.common import JsonOpt, cli_errors, err, fail, print_json

__all__ = ["cp", "split_remote"]

# "ID:/path" names a sandbox path; anything else (including "./a:b") is local.
_REMOTE = re.compile(r"^([A-Za-z0-9][\w.-]*):(.+)$")


def split_remote(arg: str) -> tuple[str, str] | None:
    """``("sb-…", "/path")`` for ``ID:/path``, else None for a local path."""
    m = _REMOTE.match(arg)
    return (m.group(1), m.group(2)) if m else None


@cli_errors
def cp(
    src: Annotated[str, typer.Argument(help="local path, - for stdin, or ID:/path")],
    dst: Annotated[str, typer.Argument(help="local path, - for stdout, or ID:/path")],
    as_json: JsonOpt = False,
) -> None:
    """Copy a file or directory into or out of a sandbox.

    As with ``cp -r``: when the destination is an existing directory, the source is copied
    into it under its own name. ``-`` as SRC writes stdin to the sandbox file; as DST it
    writes the sandbox file to stdout."""
    remote_src, remote_dst = split_remote(src), split_remote(dst)
    if (remote_src is None) == (remote_dst is None):
        raise typer.BadParameter("exactly one of SRC and DST must be ID:/path")
    if as_json and dst == "-":
        raise typer.BadParameter("--json prints to stdout, where `-` sends the file; "
                                 "give a local path instead")
    with dsec.Client() as client:
        if remote_dst is not None:
            done = _upload_stdin(client, *remote_dst) if src == "-" \
                else _upload(client, Path(src), *remote_dst)
        elif dst == "-":
            done = _download_stdout(client, *remote_src)  # type: ignore[misc]
        else:
            done = _download(client, *remote_src, Path(dst))  # type: ignore[misc]
    if as_json:
        print_json(done)


def _copied(src: str, dst: str, kind: str, n: int) -> dict:
    """What a copy did, as --json prints it (and a line on stderr either way)."""
    unit = "entries" if kind == "dir" else "bytes"
    err.print(f"copied {src} to {dst} ({n} {unit})")
    return {"src": src, "dst": dst, "type": kind, unit: n}


def _upload_stdin(client, sb_id: str, path: str) -> dict:
    if path.endswith("/"):
        fail(f"{sb_id}:{path} names a directory; stdin needs a file name to go to")
    info = client.get(sb_id).files.upload(sys.stdin.buffer, path)
    return _copied("-", f"{sb_id}:{path}", "file", info.size)


def _download_stdout(client, sb_id: str, path: str) -> dict:
    files = client.get(sb_id).files
    if files.stat(path).type == "dir":
        fail(f"{sb_id}:{path} is a directory; `-` takes a file (copy a directory to a path)")
    n = files.download(path, sys.stdout.buffer)
    return _copied(f"{sb_id}:{path}", "-", "file", n)


def _upload(client, local: Path, sb_id: str, path: str) -> dict:
    if not local.exists():
        fail(f"{local}: no such file or directory")
    files = client.get(sb_id).files
    if path.endswith("/"):  # names a directory: make it, and copy into it
        files.mkdir(path)
    target = posixpath.join(path, local.name) if _is_dir(files, path) else path
    if local.is_dir():
        files.mkdir(target)
        return _copied(str(local), f"{sb_id}:{target}", "dir", files.upload_dir(local, target))
    info = files.upload(local, target, mode=local.stat().st_mode & 0o7777)
    return _copied(str(local), f"{sb_id}:{target}", "file", info.size)


def _is_dir(files, path: str) -> bool:
    try:
        return files.stat(path).type == "dir"
    except NotFound:
        return False


def _download(client, sb_id: str, path: str, local: Path) -> dict:
    files = client.get(sb_id).files
    info = files.stat(path)
    target = local / posixpath.basename(path.rstrip("/")) if local.is_dir() else local
    if info.type == "dir":
        return _copied(f"{sb_id}:{path}", str(target), "dir", _download_dir(files, path, target))
    if not target.parent.is_dir():
        fail(f"{target.parent}: no such directory")
    n = files.download(path, target)
    target.chmod(info.mode & 0o7777)
    return _copied(f"{sb_id}:{path}", str(target), "file", n)


def _download_dir(files, path: str, target: Path) -> int:
    """Make ``target`` a copy of the sandbox directory ``path``.

    The server's tar holds the directory under its own base name, so unpack next to
    ``target`` and move that one entry into place."""
    if target.exists():
        fail(f"{target} already exists")
    if not target.parent.is_dir():
        fail(f"{target.parent}: no such directory")
    staging = Path(tempfile.mkdtemp(prefix=".dsec-cp-", dir=target.parent))
    try:
        n = files.download_dir(path, staging)
        top = posixpath.basename(path.rstrip("/"))
        (staging / top if top else staging).rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return n
