"""envd's ``process.Process`` service on the node's background processes.

Every command (``commands.run``, foreground or not, and ``pty.create``) is a background
process of the node (``node/processes.py``), started by pid and followed by pid: the Start
stream is one follower of it, ``Connect`` another (it replays the output the node kept from
the start, then follows), ``SendInput``/``StreamInput``/``CloseStdin`` write to its stdin or
terminal, ``Update`` resizes its terminal. The command runs through a small ``sh`` prologue
that leaves a record of it in ``/dev/shm`` for ``List`` and then ``exec``\\ s the command,
so the pid stays the command's own and the process group is the command's (the in-sandbox
agent makes every command a session leader). ``SendSignal`` signals that group with a
one-line exec; ``List`` reads the records of processes still alive. An image without
``/bin/bash`` (busybox) runs the SDK's ``/bin/bash -l -c CMD`` with ``/bin/sh``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import AsyncIterator
from dataclasses import dataclass

from dsec.api.errors import DSecError
from dsec.api.models import ExecEvent, ExecRequest, ExecResult, validated
from dsec.api.process import ProcessInfo as KeptProcess
from dsec.api.process import ProcessRequest, PtySize, StdinRequest
from dsec.cluster.nodeclient import NodeClient
from dsec.integrations.e2b.connect import RpcError, envelope, from_dsec
from dsec.integrations.e2b.messages import (SIGNALS, CloseStdinRequest, ConnectRequest,
                                            ListResponse, ProcessConfig, ProcessInfo,
                                            ProcessSelector, SendInputRequest,
                                            SendSignalRequest, StartRequest,
                                            StreamInputRequest, UpdateRequest)

__all__ = ["Target", "start_events", "connect_events", "list_processes", "send_signal",
           "send_input", "close_stdin", "update", "stream_input", "decode_user"]

# Records go to /dev/shm, the sandbox's own in containers (outside its image layer) and
# guests (out of sight of a files.list of /tmp), or to /tmp in an image without it.
_PROLOGUE = (
    '{ printf "%s" "$1" > "/dev/shm/.e2b-proc-$$" || printf "%s" "$1" > "/tmp/.e2b-proc-$$"; '
    '} 2>/dev/null; shift; p="$1"; shift; '
    'if [ "$p" = /bin/bash ] && [ ! -x /bin/bash ]; then p=/bin/sh; fi; exec "$p" "$@"')
_LIST = ('for f in /dev/shm/.e2b-proc-* /tmp/.e2b-proc-*; do [ -f "$f" ] || continue; '
         'p="${f##*/.e2b-proc-}"; '
         'if kill -0 "$p" 2>/dev/null; then printf "%s\\t" "$p"; cat "$f"; echo; '
         'else rm -f "$f"; fi; done')
_NO_SUCH = 3


@dataclass
class Target:
    """The sandbox an envd call is for, and who to ask about it."""

    sb_id: str
    client: NodeClient
    user: str | None = None


def _b64(text: str) -> str:
    return base64.b64encode(text.encode("utf-8", "surrogateescape")).decode("ascii")


def _event(**event) -> bytes:
    return envelope({"event": event})


async def _exec(target: Target, script: str, *args: str) -> ExecResult:
    req = validated(ExecRequest, cmd=["/bin/sh", "-c", script, "e2b", *args], timeout=30,
                    max_output=1 << 20)
    try:
        return await target.client.exec(target.sb_id, req)
    except DSecError as exc:
        raise from_dsec(exc, target.sb_id) from exc


async def list_processes(target: Target) -> ListResponse:
    """The commands still running: the node's own list first (it knows a command from the
    moment it starts, before the prologue has written its record), then the records."""
    try:
        kept = await target.client.process_list(target.sb_id)
    except DSecError as exc:
        raise from_dsec(exc, target.sb_id) from exc
    procs = {p.pid: ProcessInfo(config=config, pid=p.pid) for p in kept
             if p.running and (config := _config_of(p.cmd)) is not None}
    out = await _exec(target, _LIST)
    for line in out.stdout.splitlines():
        pid, _, record = line.partition("\t")
        if not pid.isdigit() or int(pid) in procs:
            continue
        try:
            config = ProcessConfig.model_validate_json(record)
        except ValueError:
            continue  # a record the sandbox's own processes overwrote
        procs[int(pid)] = ProcessInfo(config=config, pid=int(pid))
    return ListResponse(processes=list(procs.values()))


def _config_of(cmd: str | list[str]) -> ProcessConfig | None:
    """The E2B config of a node process started through the prologue, else None."""
    if isinstance(cmd, str) or len(cmd) < 5 or cmd[:4] != ["/bin/sh", "-c", _PROLOGUE, "e2b"]:
        return None
    try:
        return ProcessConfig.model_validate_json(cmd[4])
    except ValueError:
        return None


async def send_signal(target: Target, req: SendSignalRequest) -> None:
    if req.process.pid is None:
        raise RpcError("invalid_argument", "select the process by pid (tags belong to PTY "
                                           "sessions, which dsec's E2B API does not serve)")
    sig = SIGNALS.get(req.signal)
    if sig is None:
        raise RpcError("invalid_argument", "signal must be SIGNAL_SIGKILL or SIGNAL_SIGTERM")
    pid = str(req.process.pid)
    # The group first, then the process alone. Shells disagree on `kill -- -PID` (busybox
    # signals the group, then fails on "--"), so a failed kill whose target is gone since
    # the check counts as done: the process was there, and it has ended.
    out = await _exec(target, f'kill -0 "$1" 2>/dev/null || exit {_NO_SUCH}; '
                              f'kill -s {sig} -- "-$1" 2>/dev/null || '
                              f'kill -s {sig} "$1" 2>/dev/null || '
                              f'! kill -0 "$1" 2>/dev/null', pid)
    if out.exit_code == _NO_SUCH:
        raise RpcError("not_found", f"process {pid} not found in sandbox {target.sb_id}")
    if out.exit_code != 0:
        raise RpcError("internal", f"signalling process {pid}: {out.stderr.strip()}")


def _process_request(req: StartRequest, timeout: float | None, max_output: int,
                     user: str | None) -> ProcessRequest:
    p = req.process
    record = p.model_dump_json(by_alias=True, exclude_none=True)
    pty = None if req.pty is None else {"rows": req.pty.size.rows, "cols": req.pty.size.cols}
    try:
        return validated(ProcessRequest, cmd=["/bin/sh", "-c", _PROLOGUE, "e2b", record, p.cmd,
                                              *p.args],
                         env=p.envs, cwd=p.cwd, user=user, max_output=max_output,
                         timeout=min(timeout, 86400) if timeout else None,
                         stdin_open=bool(req.stdin), pty=pty)
    except DSecError as exc:
        raise from_dsec(exc) from exc


async def start_events(target: Target, req: StartRequest, timeout: float | None,
                       max_output: int, keepalive_s: float | None) -> AsyncIterator[bytes]:
    """The envelopes of one command: its pid, its output as it comes, its end. The command
    is a background process of the node, so it outlives this stream (``Connect`` follows
    it again by pid) and takes input from any call (``SendInput``)."""
    proc_req = _process_request(req, timeout, max_output, target.user)
    try:
        info = await target.client.process_start(target.sb_id, proc_req)
    except DSecError as exc:
        raise from_dsec(exc, target.sb_id) from exc
    yield _event(start={"pid": info.pid})
    async for chunk in _follow(target, info.pid, req.pty is not None, keepalive_s,
                               _Relay(max_output, timeout)):
        yield chunk


async def _kept(target: Target, pid: int) -> KeptProcess:
    """The node's record of ``pid``, or not_found naming what can be followed."""
    try:
        for info in await target.client.process_list(target.sb_id):
            if info.pid == pid:
                return info
    except DSecError as exc:
        raise from_dsec(exc, target.sb_id) from exc
    raise RpcError("not_found", f"process {pid} not found in sandbox {target.sb_id}: only "
                                f"commands started through the E2B API (commands.run, "
                                f"pty.create) can be connected to or sent input")


async def connect_events(target: Target, req: ConnectRequest, deadline_s: float | None,
                         max_output: int, keepalive_s: float | None) -> AsyncIterator[bytes]:
    """A running (or ended) command again: its pid, every output chunk the node kept from
    the start, what comes next, its end. The deadline ends the stream, not the command."""
    info = await _kept(target, _pid(req.process))
    yield _event(start={"pid": info.pid})
    async for chunk in _follow(target, info.pid, info.pty, keepalive_s,
                               _Relay(max_output, None), deadline_s):
        yield chunk


async def _follow(target: Target, pid: int, pty: bool, keepalive_s: float | None,
                  relay: "_Relay", deadline_s: float | None = None) -> AsyncIterator[bytes]:
    """The envelopes of ``pid``'s events; keepalives while none come; with ``deadline_s``,
    deadline_exceeded once that passes (the process goes on)."""
    loop = asyncio.get_running_loop()
    end = None if deadline_s is None else loop.time() + deadline_s
    queue: asyncio.Queue = asyncio.Queue(maxsize=64)
    pump = asyncio.create_task(_pump(target, pid, queue))
    relay.pty = pty
    try:
        while True:
            wait = keepalive_s
            if end is not None:
                wait = min(wait or deadline_s, max(0.0, end - loop.time()))
            try:
                ev = await asyncio.wait_for(queue.get(), wait)
            except asyncio.TimeoutError:
                if end is not None and loop.time() >= end:
                    raise RpcError("deadline_exceeded", f"the timeout of {deadline_s:g} s "
                                                        f"passed; process {pid} still runs")
                yield _event(keepalive={})
                continue
            if isinstance(ev, BaseException):
                if isinstance(ev, DSecError):
                    raise from_dsec(ev, target.sb_id)
                raise ev
            yield relay.feed(ev)
            if ev.type == "exit":
                return
    finally:
        pump.cancel()


async def _pump(target: Target, pid: int, queue: asyncio.Queue) -> None:
    """The process's events into ``queue``, so the relay can send keepalives while none
    come."""
    try:
        async for ev in target.client.process_events(target.sb_id, pid, 0):
            await queue.put(ev)
    except Exception as exc:  # handed to the relay, which ends the stream with it
        await queue.put(exc)


class _Relay:
    """ExecEvents to envd's ProcessEvents: output (a terminal's as ``pty``), then the end."""

    def __init__(self, max_output: int, timeout: float | None) -> None:
        self.max_output, self.timeout = max_output, timeout
        self.pty = False

    def feed(self, ev: ExecEvent) -> bytes:
        if ev.type != "exit":
            kind = "pty" if self.pty else ev.type
            return _event(data={kind: _b64(ev.data)})
        return self._end(ev.result)

    def _end(self, result: ExecResult | None) -> bytes:
        if result is None:
            raise RpcError("internal", "the command ended without an exit status")
        if result.timed_out:
            raise RpcError("deadline_exceeded", f"the command ran past its timeout of "
                                                f"{self.timeout or 0:g} s and was killed")
        for name, cut in (("stdout", result.stdout_truncated),
                          ("stderr", result.stderr_truncated)):
            if cut:
                raise RpcError("out_of_range", f"the command wrote more than "
                               f"{self.max_output} bytes to {name}, the most dsec's E2B API "
                               f"streams per command (E2BConfig.max_output_bytes); the rest "
                               f"was not sent: write large output to a file and read it "
                               f"with files.read")
        end = {"exitCode": result.exit_code, "exited": True,
               "status": f"exit status {result.exit_code}"}
        if result.oom_killed:
            end["error"] = "the command was killed: the sandbox ran out of memory (memory_mb)"
        return _event(end=end)


def _pid(selector: ProcessSelector) -> int:
    if selector.pid is None:
        raise RpcError("invalid_argument", "select the process by pid (dsec's E2B API keeps "
                                           "no tags)")
    return selector.pid


def _bytes_b64(data: str | None) -> str:
    """protobuf JSON bytes (standard or URL-safe base64, padding optional) as the
    padded standard base64 dsec's wire models take."""
    if not data:
        return ""
    try:
        raw = base64.urlsafe_b64decode(data.replace("+", "-").replace("/", "_")
                                       + "=" * (-len(data) % 4))
    except (ValueError, binascii.Error):
        raise RpcError("invalid_argument", "input must be base64 bytes") from None
    return base64.b64encode(raw).decode("ascii")


async def _stdin(target: Target, pid: int, data: str = "", close: bool = False) -> None:
    try:
        await target.client.process_stdin(target.sb_id, pid, StdinRequest(data=data,
                                                                           close=close))
    except DSecError as exc:
        if exc.code == "not_found" and f"pid {pid}" in exc.message:
            raise RpcError("not_found", f"process {pid} not found in sandbox "
                                        f"{target.sb_id}") from exc
        raise from_dsec(exc, target.sb_id) from exc


async def send_input(target: Target, req: SendInputRequest) -> None:
    """Bytes to a command's stdin (started with ``stdin=True``) or to its terminal."""
    data = req.input.stdin if req.input.stdin is not None else req.input.pty
    await _stdin(target, _pid(req.process), _bytes_b64(data))


async def close_stdin(target: Target, req: CloseStdinRequest) -> None:
    await _stdin(target, _pid(req.process), close=True)


async def update(target: Target, req: UpdateRequest) -> None:
    """Resize a PTY (the one thing envd's Update changes)."""
    if req.pty is None:
        return
    size = PtySize(rows=req.pty.size.rows, cols=req.pty.size.cols)
    pid = _pid(req.process)
    try:
        await target.client.process_resize(target.sb_id, pid, size)
    except DSecError as exc:
        raise from_dsec(exc, target.sb_id) from exc


async def stream_input(target: Target, messages: AsyncIterator[StreamInputRequest]) -> None:
    """StreamInput: a start naming the process, then its input in order."""
    pid = None
    async for msg in messages:
        if msg.start is not None:
            pid = _pid(msg.start.process)
            await _kept(target, pid)
        elif msg.data is not None:
            if pid is None:
                raise RpcError("invalid_argument", "StreamInput must start with a start "
                                                   "message naming the process")
            inp = msg.data.input
            await _stdin(target, pid, _bytes_b64(inp.stdin if inp.stdin is not None
                                                 else inp.pty))


def decode_user(authorization: str | None) -> str | None:
    """The user of envd's ``Authorization: Basic base64(user:)``, or None."""
    if not authorization or not authorization.lower().startswith("basic "):
        return None
    try:
        raw = base64.b64decode(authorization[6:].strip(), validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        raise RpcError("invalid_argument", "Authorization: Basic must hold base64 "
                                           "'user:'") from None
    return raw.partition(":")[0] or None
