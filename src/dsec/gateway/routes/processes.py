"""Background processes of a sandbox, by pid, and the sandbox's timeout."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from dsec.api.errors import DSecError
from dsec.api.models import SandboxInfo
from dsec.api.process import (ProcessInfo, ProcessList, ProcessRequest, ProcessWaitRequest,
                              PtySize, SignalRequest, StdinRequest, TimeoutRequest)
from dsec.gateway.openapi import ndjson_answer
from dsec.gateway.routes.common import (check_grading, client_for, next_while, validity,
                                        while_valid)

__all__ = ["router"]

router = APIRouter(prefix="/v1/sandboxes/{sb_id}")


@router.post("/timeout", response_model=SandboxInfo)
async def set_timeout(request: Request, sb_id: str, req: TimeoutRequest) -> SandboxInfo:
    """The sandbox now stops ``timeout_s`` seconds from now (later or sooner than before)."""
    return await client_for(request, sb_id).set_timeout(sb_id, req.timeout_s)


@router.post("/processes", response_model=ProcessInfo, status_code=201)
async def start(request: Request, sb_id: str, req: ProcessRequest) -> ProcessInfo:
    """Start a command in the background; answers once it runs, with its pid. Its output
    is kept on the node (up to ``max_output`` per stream) for any client to read."""
    check_grading(request, req.grading)
    return await client_for(request, sb_id).process_start(sb_id, req)


@router.get("/processes", response_model=ProcessList)
async def list_processes(request: Request, sb_id: str) -> ProcessList:
    """Running and recently ended background processes (without their output)."""
    return ProcessList(processes=await client_for(request, sb_id).process_list(sb_id))


@router.get("/processes/{pid}", response_model=ProcessInfo)
async def get(request: Request, sb_id: str, pid: int) -> ProcessInfo:
    """One process with its output so far, and its result once it ended."""
    return await client_for(request, sb_id).process_get(sb_id, pid)


@router.get("/processes/{pid}/events", response_class=StreamingResponse,
            responses=ndjson_answer("the kept output, what comes, then one exit"))
async def events(request: Request, sb_id: str, pid: int,
                 since: int = Query(0, ge=0, description="first output chunk to send")
                 ) -> StreamingResponse:
    """NDJSON lines of ExecEvent: the kept output from chunk ``since`` on, then what comes,
    then one ``exit``. Any number of clients may follow one process; a follow whose token
    is revoked ends with an ``unauthorized`` error line (the process goes on)."""
    stream = client_for(request, sb_id).process_events(sb_id, pid, since)
    first = await stream.__anext__()  # an unknown pid answers 404, not a broken stream
    valid = validity(request)

    async def lines() -> AsyncIterator[bytes]:
        ev = first
        while True:
            yield ev.model_dump_json().encode() + b"\n"
            if ev.type == "exit":
                return
            try:
                ev = await next_while(stream, valid)
            except StopAsyncIteration:
                return
            except DSecError as exc:
                yield json.dumps(exc.to_wire()).encode() + b"\n"
                return

    return StreamingResponse(lines(), media_type="application/x-ndjson")


@router.post("/processes/{pid}/wait", response_model=ProcessInfo)
async def wait(request: Request, sb_id: str, pid: int, req: ProcessWaitRequest) -> ProcessInfo:
    """Answers when the process ends (or after ``timeout``, still running); Unauthorized
    once the caller's token stops working meanwhile (the process goes on)."""
    return await while_valid(request, client_for(request, sb_id).process_wait(sb_id, pid,
                                                                              req.timeout))


@router.post("/processes/{pid}/signal", status_code=204)
async def signal(request: Request, sb_id: str, pid: int, req: SignalRequest) -> None:
    """Send a signal to the process group (SIGKILL by default)."""
    await client_for(request, sb_id).process_signal(sb_id, pid, req.signal)


@router.post("/processes/{pid}/stdin", status_code=204)
async def stdin(request: Request, sb_id: str, pid: int, req: StdinRequest) -> None:
    """Write to the stdin of a process started with ``stdin_open``; ``close`` ends it."""
    await client_for(request, sb_id).process_stdin(sb_id, pid, req)


@router.post("/processes/{pid}/resize", status_code=204)
async def resize(request: Request, sb_id: str, pid: int, req: PtySize) -> None:
    """Resize the terminal of a process started with ``pty``."""
    await client_for(request, sb_id).process_resize(sb_id, pid, req)
