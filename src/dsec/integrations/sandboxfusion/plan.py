"""From a SandboxFusion ``run_code`` request to one dsec fncall, and back. Pure, no I/O.

Python and bash without ``fetch_files`` run natively (Python in a fork of the worker's warm
interpreter). Every other call runs a small bash driver in the worker: it compiles under
``timeout compile_timeout`` with the compiler's output kept in files, runs the program
under ``timeout run_timeout`` with the call's stdin and its stdout/stderr as the call's
own, and writes each step's exit status, its time and the size of every file to return,
so the answer carries separate compile and run results as SandboxFusion's does.
"""

from __future__ import annotations

import base64
import binascii
import shlex
from dataclasses import dataclass

from dsec.api.fncall import FnCallRequest, FnCallResult
from dsec.integrations.sandboxfusion.languages import RECIPES, run_command, source_for
from dsec.integrations.sandboxfusion.models import (CommandRunResult, CommandRunStatus,
                                                    RunCodeRequest, RunCodeResponse, RunStatus)

__all__ = ["Call", "plan", "answer", "OUTPUT_LIMIT", "FILE_LIMIT", "memory_for", "DRIVER_DIR"]

OUTPUT_LIMIT = 8 << 20   # per stream; the node keeps at most this much of an exec's output
FILE_LIMIT = 16 << 20    # per returned file; the node's fncall workers return at most this
DEFAULT_MEMORY_MB = 1024  # for memory_limit_MB=-1; JVMs and compilers want more than 256
MAX_MEMORY_MB = 16384
DISK_MB = 512             # the call's writable space: build caches, class files, binaries
PIDS = 512                # JVMs and go build start many threads
MARGIN_S = 5.0            # the driver's own time around the two steps
DRIVER_DIR = ".dsec-sf"


@dataclass
class Call:
    """What to send (``request``) and what is needed to read its result back."""

    request: FnCallRequest
    language: str
    compiled: bool
    native: bool
    fetch: list[str]
    compile_timeout: float
    run_timeout: float


class BadRequest(ValueError):
    """A request SandboxFusion would refuse as invalid; ``loc`` names the field."""

    def __init__(self, loc: list, msg: str) -> None:
        super().__init__(msg)
        self.loc = loc


def memory_for(limit_mb: int) -> int:
    """The worker size for ``memory_limit_MB``: the next power of two (pools are per size,
    so arbitrary sizes would each start a pool), at least 128 MiB."""
    if limit_mb <= 0:
        return DEFAULT_MEMORY_MB
    if limit_mb > MAX_MEMORY_MB:
        raise BadRequest(["body", "memory_limit_MB"],
                         f"memory_limit_MB may be at most {MAX_MEMORY_MB}; got {limit_mb}")
    size = 128
    while size < limit_mb:
        size *= 2
    return size


def _input_files(files: dict[str, str | None]) -> dict[str, bytes]:
    out = {}
    for name, content in files.items():
        if content is None or "IGNORE_THIS_FILE" in name:  # as SandboxFusion skips them
            continue
        try:
            out[name] = base64.b64decode(content, validate=True)
        except binascii.Error as exc:
            raise BadRequest(["body", "files", name],
                             f"files[{name!r}] must be base64; {exc}") from None
    return out


def plan(req: RunCodeRequest, image: str) -> Call:
    """The fncall that runs ``req`` in ``image`` (which has the language)."""
    recipe = RECIPES[req.language]
    files = _input_files(req.files)
    name, code, _ = source_for(req.language, req.code)
    native = recipe.native is not None and not req.fetch_files
    common = dict(image=image, memory_mb=memory_for(req.memory_limit_MB), disk_mb=DISK_MB,
                  pids=PIDS, max_output=OUTPUT_LIMIT,
                  stdin=req.stdin.encode() if req.stdin else None)
    if native:
        fn = FnCallRequest(language=recipe.native, code=code, files=files,
                           timeout=req.run_timeout, **common)
    else:
        files[name] = code.encode()
        fn = FnCallRequest(language="bash", code=driver(req), files=files,
                           argv=list(req.fetch_files),
                           return_files=_returned(req, recipe.compile is not None),
                           timeout=req.compile_timeout + req.run_timeout + MARGIN_S,
                           **common)
    return Call(fn, req.language, recipe.compile is not None, native, list(req.fetch_files),
                req.compile_timeout, req.run_timeout)


def _returned(req: RunCodeRequest, compiled: bool) -> list[str]:
    own = ["r.rc", "sizes"] + (["c.rc", "c.out", "c.err"] if compiled else [])
    return [f"{DRIVER_DIR}/{n}" for n in own] + list(req.fetch_files)


def driver(req: RunCodeRequest) -> str:
    """The bash script that compiles and runs ``req`` and records each step."""
    recipe = RECIPES[req.language]
    d = DRIVER_DIR
    lines = ["set +e", f"mkdir -p {d}", "now() { date +%s%N; }"]
    if recipe.compile is not None:
        lines += [
            "t0=$(now)",
            f"timeout -k 1 {req.compile_timeout:.3f} bash -c {shlex.quote(recipe.compile)} "
            f"</dev/null >{d}/c.out 2>{d}/c.err",
            "rc=$?", f'echo "$rc $(( $(now) - t0 ))" >{d}/c.rc',
            f'[ "$rc" = 0 ] || {{ stat -c "%s %n" {d}/c.out {d}/c.err >{d}/sizes; exit 0; }}']
    run = run_command(req.language, req.code)
    lines += [
        "t0=$(now)",
        f"timeout -k 1 {req.run_timeout:.3f} bash -c {shlex.quote(run)}",
        "rc=$?", f'echo "$rc $(( $(now) - t0 ))" >{d}/r.rc',
        # sizes of everything returned, so nothing cut at the node's limit goes unnoticed
        f'for f in {d}/c.out {d}/c.err "$@"; do [ -f "$f" ] && stat -c "%s %n" -- "$f"; '
        f"done >{d}/sizes",
        "exit 0"]
    return "\n".join(lines) + "\n"


# ---- the result ----

def _status_line(raw: bytes | None) -> tuple[int, float] | None:
    try:
        rc, ns = (raw or b"").split()
        return int(rc), int(ns) / 1e9
    except ValueError:
        return None


def _step(line: tuple[int, float] | None, limit: float, stdout: str, stderr: str,
          timed_out: bool) -> CommandRunResult:
    if line is None:  # the worker ended the call before the step wrote its status
        status = CommandRunStatus.TimeLimitExceeded if timed_out else CommandRunStatus.Error
        return CommandRunResult(status=status, stdout=stdout, stderr=stderr)
    rc, took = line
    if rc in (124, 137) and took >= limit * 0.98:  # timeout(1)'s answers, at the limit
        return CommandRunResult(status=CommandRunStatus.TimeLimitExceeded,
                                execution_time=took, stdout=stdout, stderr=stderr)
    return CommandRunResult(status=CommandRunStatus.Finished, execution_time=took,
                            return_code=rc, stdout=stdout, stderr=stderr)


def _text(data: bytes | None) -> str:
    return (data or b"").decode("utf-8", "replace")


def _native(call: Call, out: FnCallResult) -> CommandRunResult:
    took = out.duration_ms / 1000
    if out.timed_out:
        return CommandRunResult(status=CommandRunStatus.TimeLimitExceeded, execution_time=took,
                                stdout=out.stdout, stderr=out.stderr)
    rc = -out.signal if out.signal else out.exit_code
    return CommandRunResult(status=CommandRunStatus.Finished, execution_time=took,
                            return_code=rc, stdout=out.stdout, stderr=out.stderr)


def _too_big(call: Call, out: FnCallResult) -> str | None:
    for stream in ("stdout", "stderr"):
        if getattr(out, f"{stream}_truncated"):
            return (f"the program wrote more than {OUTPUT_LIMIT} bytes to {stream}, the most "
                    f"run_code returns; the {stream} shown is cut there")
    if call.native:
        return None
    for line in _text(out.files.get(f"{DRIVER_DIR}/sizes")).splitlines():
        size, _, name = line.partition(" ")
        if size.isdigit() and int(size) > FILE_LIMIT:
            what = "compiler output" if name.startswith(DRIVER_DIR) else f"file {name!r}"
            return (f"the {what} holds {size} bytes; run_code returns at most {FILE_LIMIT} "
                    "bytes of a file (fetch a smaller one, or split it)")
    return None


def answer(call: Call, out: FnCallResult) -> RunCodeResponse:
    """SandboxFusion's response for what the fncall did."""
    compile_result = run_result = None
    if call.native:
        run_result = _native(call, out)
    else:
        f = out.files
        if call.compiled:
            compile_result = _step(_status_line(f.get(f"{DRIVER_DIR}/c.rc")),
                                   call.compile_timeout, _text(f.get(f"{DRIVER_DIR}/c.out")),
                                   _text(f.get(f"{DRIVER_DIR}/c.err")), out.timed_out)
        if compile_result is None or (compile_result.status == CommandRunStatus.Finished
                                      and compile_result.return_code == 0):
            run_result = _step(_status_line(f.get(f"{DRIVER_DIR}/r.rc")), call.run_timeout,
                               out.stdout, out.stderr, out.timed_out)
    files = {name: base64.b64encode(out.files[name]).decode()
             for name in call.fetch if name in out.files}
    resp = RunCodeResponse(status=RunStatus.Success, message="", compile_result=compile_result,
                           run_result=run_result, files=files, executor_pod_name=out.worker)
    resp.status, resp.message = _overall(resp)
    if resp.status != RunStatus.SandboxError and (why := _too_big(call, out)):
        resp.status, resp.message = RunStatus.SandboxError, why
    return resp


def _overall(resp: RunCodeResponse) -> tuple[RunStatus, str]:
    """SandboxFusion's rule: an Error step is a sandbox error, a time-out or a non-zero exit
    a failure, else success."""
    steps = [s for s in (resp.compile_result, resp.run_result) if s is not None]
    for s in steps:
        if s.status == CommandRunStatus.Error:
            return RunStatus.SandboxError, s.stderr or "the sandbox could not run the step"
    if any(s.status == CommandRunStatus.TimeLimitExceeded for s in steps):
        return RunStatus.Failed, ""
    if any(s.return_code not in (0, None) for s in steps):
        return RunStatus.Failed, ""
    return RunStatus.Success, ""


def scala_error(req: RunCodeRequest) -> RunCodeResponse | None:
    """SandboxFusion's own answer for Scala code with no ``object`` (nothing is run)."""
    _, _, err = source_for(req.language, req.code)
    if err is None:
        return None
    step = CommandRunResult(status=CommandRunStatus.Error, return_code=1, stderr=err)
    return RunCodeResponse(status=RunStatus.SandboxError, message=err, compile_result=step)
