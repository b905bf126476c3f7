"""envd's directory watchers (``files.watch_dir``) on dsec's file listing.

Decision: a watcher compares listings of the directory (name, type, size, mode, mtime of
every entry, to the depth asked) instead of reading inotify inside the sandbox: dsec's
files API lists any backend's sandbox from the node, with no tool in the image. The price:
an entry created and removed between two looks is not seen, and several writes to one file
between two looks are one ``WRITE``. The async SDK's ``WatchDir`` stream looks every
``E2BConfig.watch_interval_s``; the sync SDK's watcher (``CreateWatcher``, then
``GetWatcherEvents`` for what changed since the last call) keeps its last listing inside the
sandbox, in ``/dev/shm`` like the process records, so any gateway serves the next call.
"""

from __future__ import annotations

import asyncio
import base64
import json
import posixpath
import re
import secrets
from collections.abc import AsyncIterator

from dsec.api.errors import DSecError
from dsec.api.models import ExecRequest, ExecResult, FileInfo, validated
from dsec.integrations.e2b.connect import RpcError, envelope, from_dsec
from dsec.integrations.e2b.filesystem import resolve
from dsec.integrations.e2b.messages import WatcherRequest, WatchRequest
from dsec.integrations.e2b.process import Target

__all__ = ["Listing", "diff", "watch_events", "create_watcher", "watcher_events",
           "remove_watcher", "MAX_ENTRIES"]

MAX_ENTRIES = 20_000  # a watcher's listing; past it the watch is refused, naming the limit
_DEPTH = 16           # how deep a recursive watcher looks
_ID = re.compile(r"w-[0-9a-f]{16}")
_OWN = (".e2b-watch-", ".e2b-proc-")
Listing = dict[str, tuple]  # name relative to the watched dir -> (type, size, mode, mtime)
_STATE = ('f=/dev/shm/.e2b-watch-"$1"; [ -d /dev/shm ] || f=/tmp/.e2b-watch-"$1"; ')


def diff(old: Listing, new: Listing) -> list[dict]:
    """The envd events that take listing ``old`` to ``new``, removals first, by name."""
    events = [{"name": n, "type": "EVENT_TYPE_REMOVE"} for n in sorted(old.keys() - new)]
    for name in sorted(new):
        was, now = old.get(name), new[name]
        if was is None or was[0] != now[0]:  # a new entry, or another kind under its name
            if was is not None:
                events.append({"name": name, "type": "EVENT_TYPE_REMOVE"})
            events.append({"name": name, "type": "EVENT_TYPE_CREATE"})
            continue
        if was[1:2] + was[3:] != now[1:2] + now[3:] and now[0] != "dir":
            events.append({"name": name, "type": "EVENT_TYPE_WRITE"})
        if was[2] != now[2]:
            events.append({"name": name, "type": "EVENT_TYPE_CHMOD"})
    return events


def _key(info: FileInfo) -> tuple:
    return (info.type, info.size, info.mode, info.mtime)


async def _listing(target: Target, root: str, recursive: bool) -> Listing:
    found: Listing = {}
    todo = [(root, 1)]
    try:
        while todo:
            path, level = todo.pop(0)
            for info in await target.client.file_list(target.sb_id, path):
                if info.name.startswith(_OWN):
                    continue  # dsec's own records, when /dev/shm is missing and they sit here
                found[posixpath.relpath(info.path, root)] = _key(info)
                if recursive and info.type == "dir" and level < _DEPTH:
                    todo.append((info.path, level + 1))
            if len(found) > MAX_ENTRIES:
                raise RpcError("resource_exhausted", f"{root} holds more than {MAX_ENTRIES} "
                               "entries, the most a dsec watcher follows: watch a smaller "
                               "directory (or without recursive)")
    except DSecError as exc:
        raise from_dsec(exc, target.sb_id) from exc
    return found


async def _root(target: Target, req: WatchRequest) -> str:
    root = resolve(req.path, target.user)
    try:
        info = await target.client.file_stat(target.sb_id, root)
    except DSecError as exc:
        raise from_dsec(exc, target.sb_id) from exc
    if info.type != "dir":
        raise RpcError("invalid_argument", f"{root} is not a directory: watch_dir watches "
                                           "directories")
    return root


async def watch_events(target: Target, req: WatchRequest, interval_s: float,
                       keepalive_s: float | None, deadline_s: float | None
                       ) -> AsyncIterator[bytes]:
    """WatchDir: a start event, then the events of each look, until the deadline."""
    root = await _root(target, req)
    seen = await _listing(target, root, req.recursive)
    yield envelope({"start": {}})
    loop = asyncio.get_running_loop()
    end = None if deadline_s is None else loop.time() + deadline_s
    quiet = 0.0
    while end is None or loop.time() < end:
        await asyncio.sleep(interval_s if end is None
                            else max(0.0, min(interval_s, end - loop.time())))
        now = await _listing(target, root, req.recursive)
        events, seen = diff(seen, now), now
        for ev in events:
            yield envelope({"filesystem": ev})
        quiet = 0.0 if events else quiet + interval_s
        if keepalive_s and quiet >= keepalive_s:
            quiet = 0.0
            yield envelope({"keepalive": {}})
    raise RpcError("deadline_exceeded", f"the watch's timeout of {deadline_s:g} s passed")


async def _exec(target: Target, script: str, wid: str, stdin: bytes | None = None
                ) -> ExecResult:
    req = validated(ExecRequest, cmd=["/bin/sh", "-c", _STATE + script, "e2b", wid],
                    timeout=60, max_output=64 << 20,
                    stdin=base64.b64encode(stdin).decode() if stdin is not None else None)
    try:
        return await target.client.exec(target.sb_id, req)
    except DSecError as exc:
        raise from_dsec(exc, target.sb_id) from exc


async def _save(target: Target, wid: str, state: dict) -> None:
    out = await _exec(target, 'cat > "$f.new" && mv "$f.new" "$f"', wid,
                      json.dumps(state, separators=(",", ":")).encode())
    if out.exit_code != 0:
        raise RpcError("internal", f"keeping watcher {wid} in the sandbox: "
                                   f"{out.stderr.strip()[:300]}")


async def _load(target: Target, wid: str) -> dict:
    if not _ID.fullmatch(wid):
        raise RpcError("not_found", f"watcher {wid[:40]!r} not found (ids come from "
                                    "CreateWatcher)")
    out = await _exec(target, 'cat "$f" 2>/dev/null || exit 3', wid)
    if out.exit_code == 3:
        raise RpcError("not_found", f"watcher {wid} not found in sandbox {target.sb_id}")
    try:
        return json.loads(out.stdout)
    except ValueError:
        raise RpcError("data_loss", f"watcher {wid}'s record in the sandbox was overwritten: "
                                    "create a new watcher") from None


async def create_watcher(target: Target, req: WatchRequest) -> dict:
    root = await _root(target, req)
    wid = f"w-{secrets.token_hex(8)}"
    await _save(target, wid, {"root": root, "recursive": req.recursive,
                              "seen": await _listing(target, root, req.recursive)})
    return {"watcherId": wid}


async def watcher_events(target: Target, req: WatcherRequest) -> dict:
    """What changed since the watcher's last look (CreateWatcher or the previous call)."""
    state = await _load(target, req.watcher_id)
    old = {k: tuple(v) for k, v in state["seen"].items()}
    try:
        now = await _listing(target, state["root"], state["recursive"])
    except RpcError as err:
        if err.code != "not_found":
            raise
        now = {}  # the watched directory itself went: everything in it was removed
    state["seen"] = now
    await _save(target, req.watcher_id, state)
    return {"events": diff(old, now)}


async def remove_watcher(target: Target, req: WatcherRequest) -> dict:
    await _load(target, req.watcher_id)
    await _exec(target, 'rm -f "$f"', req.watcher_id)
    return {}
