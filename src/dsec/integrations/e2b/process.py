"""envd's ``process.Process`` service on dsec's exec.

Each command runs through a small ``sh`` prologue that prints its pid first (E2B's stream
opens with the pid, dsec's exec reports it only at the end), leaves a record of the
command in ``/dev/shm`` for ``List``, and then ``exec``\\ s the command, so the pid stays
the command's own and the process group is the command's (the in-sandbox agent makes
every command a session leader). ``SendSignal`` signals that group with a one-line exec;
``List`` reads the records of processes still alive. All of it is a sandbox's own state,
so any gateway serves any call. An image without ``/bin/bash`` (busybox) runs the SDK's
``/bin/bash -l -c CMD`` with ``/bin/sh``.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from dataclasses import dataclass

from dsec.api.errors import DSecError
from dsec.api.models import ExecEvent, ExecRequest, ExecResult, validated
from dsec.cluster.nodeclient import NodeClient
from dsec.integrations.e2b.connect import RpcError, envelope, from_dsec
from dsec.integrations.e2b.messages import (SIGNALS, ListResponse, ProcessConfig, ProcessInfo,
                                            SendSignalRequest, StartRequest)

__all__ = ["Target", "start_events", "list_processes", "send_signal"]

MARK = "\x1ee2b-pid "
# Records go to /dev/shm, a tmpfs of the sandbox's own in containers and guests (out of
# sight of a files.list of /tmp), or to /tmp in an image without it.
_PROLOGUE = (
    'printf "\\036e2b-pid %s\\n" "$$"; '
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
    """The commands still running, from their records."""
    out = await _exec(target, _LIST)
    procs = []
    for line in out.stdout.splitlines():
        pid, _, record = line.partition("\t")
        try:
            config = ProcessConfig.model_validate_json(record)
        except ValueError:
            continue  # a record the sandbox's own processes overwrote
        procs.append(ProcessInfo(config=config, pid=int(pid)))
    return ListResponse(processes=procs)


async def send_signal(target: Target, req: SendSignalRequest) -> None:
    if req.process.pid is None:
        raise RpcError("invalid_argument", "select the process by pid (tags belong to PTY "
                                           "sessions, which dsec's E2B API does not serve)")
    sig = SIGNALS.get(req.signal)
    if sig is None:
        raise RpcError("invalid_argument", "signal must be SIGNAL_SIGKILL or SIGNAL_SIGTERM")
    pid = str(req.process.pid)
    out = await _exec(target, f'kill -0 "$1" 2>/dev/null || exit {_NO_SUCH}; '
                              f'kill -s {sig} -- "-$1" 2>/dev/null || kill -s {sig} "$1"', pid)
    if out.exit_code == _NO_SUCH:
        raise RpcError("not_found", f"process {pid} not found in sandbox {target.sb_id}")
    if out.exit_code != 0:
        raise RpcError("internal", f"signalling process {pid}: {out.stderr.strip()}")


def _exec_request(req: StartRequest, timeout: float | None, max_output: int,
                  user: str | None) -> ExecRequest:
    if req.pty is not None:
        raise RpcError("unimplemented", "PTY sessions are not served by dsec's E2B API; run "
                                        "the command without a pty (dsec's own SDK has shells)")
    if req.stdin:
        raise RpcError("unimplemented", "stdin=True is not served by dsec's E2B API: write "
                                        "the input to a file and redirect it (cmd < file)")
    p = req.process
    record = p.model_dump_json(by_alias=True, exclude_none=True)
    try:
        return validated(ExecRequest, cmd=["/bin/sh", "-c", _PROLOGUE, "e2b", record, p.cmd,
                                           *p.args],
                         env=p.envs, cwd=p.cwd, user=user, max_output=max_output,
                         timeout=min(timeout, 86400) if timeout else None)
    except DSecError as exc:
        raise from_dsec(exc) from exc


async def start_events(target: Target, req: StartRequest, timeout: float | None,
                       max_output: int, keepalive_s: float | None) -> AsyncIterator[bytes]:
    """The envelopes of one command: its pid, its output as it comes, its end."""
    exec_req = _exec_request(req, timeout, max_output, target.user)
    queue: asyncio.Queue = asyncio.Queue(maxsize=64)
    pump = asyncio.create_task(_pump(target, exec_req, queue))
    try:
        relay = _Relay(max_output, timeout)
        while True:
            try:
                ev = await asyncio.wait_for(queue.get(), keepalive_s)
            except asyncio.TimeoutError:
                if relay.started:
                    yield _event(keepalive={})
                continue
            if isinstance(ev, BaseException):
                if isinstance(ev, DSecError):
                    raise from_dsec(ev, target.sb_id)
                raise ev
            for chunk in relay.feed(ev):
                yield chunk
            if ev.type == "exit":
                return
    finally:
        pump.cancel()


async def _pump(target: Target, req: ExecRequest, queue: asyncio.Queue) -> None:
    """Exec events into ``queue``, so the relay can send keepalives while none come."""
    try:
        async for ev in target.client.exec_stream(target.sb_id, req):
            await queue.put(ev)
    except Exception as exc:  # handed to the relay, which ends the stream with it
        await queue.put(exc)


class _Relay:
    """ExecEvents to envd's ProcessEvents: the pid line first, then output, then the end."""

    def __init__(self, max_output: int, timeout: float | None) -> None:
        self.max_output, self.timeout = max_output, timeout
        self.started = False
        self.head = ""        # stdout before the pid line is complete
        self.held: list[ExecEvent] = []  # stderr that came before it

    def feed(self, ev: ExecEvent) -> list[bytes]:
        if ev.type == "exit":
            out = [] if self.started else self._start_from_exit(ev)
            out.append(self._end(ev.result))
            return out
        if self.started:
            return [_event(data={ev.type: _b64(ev.data)})]
        if ev.type == "stderr":
            self.held.append(ev)
            return []
        self.head += ev.data
        mark, nl, rest = self.head.partition("\n")
        if not nl:
            return []
        if not mark.startswith(MARK):
            raise RpcError("internal", f"the command's prologue did not report its pid: "
                                       f"{mark[:200]!r}")
        self.started = True
        out = [_event(start={"pid": int(mark[len(MARK):])})]
        out += [_event(data={"stderr": _b64(e.data)}) for e in self.held]
        if rest:
            out.append(_event(data={"stdout": _b64(rest)}))
        return out

    def _start_from_exit(self, ev: ExecEvent) -> list[bytes]:
        # the prologue itself failed (no /bin/sh in the image, say)
        why = (ev.result.stderr if ev.result else "") or "".join(e.data for e in self.held)
        raise RpcError("failed_precondition", f"the command could not start in the sandbox "
                                              f"(it needs /bin/sh): {why.strip()[:500]}")

    def _end(self, result: ExecResult | None) -> bytes:
        if result is None:
            raise RpcError("internal", "the command ended without an exit status")
        if result.timed_out:
            raise RpcError("deadline_exceeded", f"the command ran past its timeout of "
                                                f"{self.timeout:g} s and was killed")
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
