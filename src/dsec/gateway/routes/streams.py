"""Streaming routes: exec as NDJSON, and an interactive terminal over WebSocket."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import StreamingResponse

from dsec.api.errors import DSecError, InvalidArgument, SandboxStopped
from dsec.api.models import ExecRequest, validated
from dsec.api.process import PtySize
from dsec.gateway.openapi import ndjson_answer
from dsec.gateway.routes.common import (RECHECK_S, check_grading, client_for, next_while,
                                        revoked, validity)

__all__ = ["router"]

router = APIRouter(prefix="/v1/sandboxes/{sb_id}")


@router.post("/exec/stream", response_class=StreamingResponse,
             responses=ndjson_answer("output chunks as they come, then one exit"))
async def exec_stream(request: Request, sb_id: str, req: ExecRequest) -> StreamingResponse:
    """NDJSON lines of ExecEvent: output chunks as they come, then one ``exit``."""
    check_grading(request, req.grading)
    events = client_for(request, sb_id).exec_stream(sb_id, req)
    first = await events.__anext__()  # errors such as an unknown id surface as a status
    valid = validity(request)

    async def lines() -> AsyncIterator[bytes]:
        ev = first
        while True:
            if ev.type == "exit" and ev.result is not None:
                ev.result.stdout = ev.result.stderr = ""  # already streamed
            yield ev.model_dump_json().encode() + b"\n"
            try:
                ev = await next_while(events, valid)
            except StopAsyncIteration:
                return
            except DSecError as exc:
                yield json.dumps(exc.to_wire()).encode() + b"\n"
                return

    return StreamingResponse(lines(), media_type="application/x-ndjson")


@router.websocket("/pty")
async def pty(ws: WebSocket, sb_id: str, rows: int = 24, cols: int = 80) -> None:
    """Binary frames carry terminal bytes both ways; a text frame ``{"resize":[r,c]}``
    resizes; the server ends with a text frame ``{"exit": code}``. Any other text frame is
    answered with an error body and close code 1007; a client that leaves ends the shell."""
    await ws.accept()
    try:
        session = await client_for(ws, sb_id).pty(sb_id, rows, cols)  # type: ignore[arg-type]
    except DSecError as exc:
        await ws.send_text(json.dumps(exc.to_wire()))
        await ws.close()
        return

    close_code = 1000

    async def pump_in() -> None:
        nonlocal close_code
        while True:
            msg = await ws.receive()
            if msg["type"] == "websocket.disconnect":
                return  # the client left: normal, the shell goes with it
            if msg.get("bytes"):
                await session.send(msg["bytes"])
            elif msg.get("text"):
                try:
                    rows, cols = _resize(msg["text"])
                except InvalidArgument as exc:
                    await ws.send_text(json.dumps(exc.to_wire()))
                    close_code = 1007  # RFC 6455: data inconsistent with the message type
                    return
                await session.resize(rows, cols)

    async def pump_out() -> None:
        while True:
            try:
                out = await session.receive()
            except DSecError as exc:  # a remote node's refusal (e.g. NotFound) is its first
                await ws.send_text(json.dumps(exc.to_wire()))  # frame: say it, as here
                return
            if isinstance(out, int):
                if out != 0 and not await _live(ws, sb_id):  # killed by the stop
                    await ws.send_text(json.dumps(SandboxStopped(
                        f"sandbox {sb_id} was stopped while its terminal was open (the "
                        f"shell ended with {out})").to_wire()))
                    return
                await ws.send_text(json.dumps({"exit": out}))
                return
            await ws.send_bytes(out)

    async def watch() -> None:  # a revoked token's terminal ends as its exec stream does
        if valid is None:
            await asyncio.Event().wait()  # nothing to watch: the other pumps end it
            return
        while valid():
            await asyncio.sleep(RECHECK_S)
        await ws.send_text(json.dumps(revoked().to_wire()))

    valid = validity(ws)  # type: ignore[arg-type]
    pumps = {asyncio.create_task(pump_in()), asyncio.create_task(pump_out()),
             asyncio.create_task(watch())}
    try:
        done, _ = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            exc = task.exception()
            if exc is not None and not isinstance(exc, _GONE):
                raise exc
    finally:
        for task in pumps:
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
        await session.close()
        try:
            await ws.close(close_code)
        except (RuntimeError, WebSocketDisconnect, OSError):
            pass  # the client already left


async def _live(ws: WebSocket, sb_id: str) -> bool:
    """Whether the sandbox still runs: a shell that a stop killed ends with an exit code
    like any other, and the terminal should say the sandbox was stopped instead."""
    try:
        info = await client_for(ws, sb_id).get(sb_id)  # type: ignore[arg-type]
    except DSecError:
        return False
    return info.state != "stopped"


# How a terminal ends without an error: the node's session ended, or the client left.
_GONE = (DSecError, OSError, WebSocketDisconnect)


def _resize(text: str) -> tuple[int, int]:
    """The ``(rows, cols)`` of a terminal's text frame ``{"resize": [rows, cols]}``."""
    try:
        ctl = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nested past the stack
        ctl = None
    size = ctl.get("resize") if isinstance(ctl, dict) else None
    if not (isinstance(size, list) and len(size) == 2):
        raise InvalidArgument(f"a terminal text frame must be {{\"resize\": [rows, cols]}}; "
                              f"got {text[:80]!r}; send terminal input as binary frames")
    size = validated(PtySize, rows=size[0], cols=size[1])
    return size.rows, size.cols
