"""Wire models of the ``fncall`` backend: one stateless call of code or a Python callable.

Binary fields (stdin, input files, returned files, a callable's pickled value) are bytes in
Python and base64 strings in JSON, so no caller ever base64-encodes by hand.
"""

from __future__ import annotations

import base64
import binascii
import posixpath
from typing import Annotated, Literal

from pydantic import (BaseModel, ConfigDict, Field, PlainSerializer, PlainValidator,
                      field_validator, model_validator)

from dsec.api.errors import RemoteError, SandboxTimeout
from dsec.api.limits import (DEFAULT_LIMITS as _L, RequestModel, check_argv, check_env,
                             check_path)
from dsec.api.models import ProcessOutcome

__all__ = ["Language", "FnCallRequest", "FnCallResult", "FnCallBatch", "FnCallBatchResult",
           "RemoteErrorInfo", "RemoteError", "LANGUAGES"]

Language = Literal["python", "bash", "sh", "c", "cpp"]
LANGUAGES: tuple[str, ...] = ("python", "bash", "sh", "c", "cpp")


def _from_wire(v: object) -> bytes:
    if isinstance(v, (bytes, bytearray)):
        return bytes(v)
    if isinstance(v, str):
        try:
            return base64.b64decode(v, validate=True)
        except binascii.Error as exc:
            raise ValueError(f"not valid base64: {exc}") from exc
    raise ValueError(f"expected bytes or a base64 string; got {type(v).__name__}")


Blob = Annotated[bytes, PlainValidator(_from_wire),
                 PlainSerializer(lambda b: base64.b64encode(b).decode(), return_type=str,
                                 when_used="json")]


# directories deep a call's file may sit: deeper is a hostile tree, not a project layout
MAX_FILE_DEPTH = 64


def _relative(path: str) -> str:
    norm = posixpath.normpath(path)
    if not path or path.startswith("/") or norm == ".." or norm.startswith("../") or "\0" in path:
        raise ValueError(f"file paths must be relative to the call's directory and stay "
                         f"inside it; got {path!r}")
    check_path(norm, "a file path")
    if (depth := norm.count("/")) > MAX_FILE_DEPTH:
        raise ValueError(f"file path {norm[:60]!r}... is {depth} directories deep; at most "
                         f"{MAX_FILE_DEPTH}")
    return norm


class FnCallRequest(RequestModel):
    """One stateless call: ``code`` in ``language``, or a pickled Python ``callable``."""

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"language": "python", "code": "print(1 + 1)", "timeout": 5}]})

    language: Language = Field("python", description="python, bash, sh, c or cpp")
    code: str | None = Field(None, max_length=1 << 22, description="source code to run")
    callable: Blob | None = Field(None, description="cloudpickle of (function, args, kwargs)")
    image: str = Field("python:3.11", min_length=1, max_length=256,
                       description="image of the worker pool that runs the call")
    argv: list[str] = Field(default_factory=list, max_length=1024,
                            description="arguments to the program (sys.argv[1:] in Python); "
                                        f"at most {_L.cmd_bytes} bytes in all")
    stdin: Blob | None = Field(None, description="bytes fed to the program's stdin")
    files: dict[str, Blob] = Field(default_factory=dict, max_length=1024,
                                   description="input files, relative path -> content")
    return_files: list[str] = Field(default_factory=list, max_length=256,
                                    description="relative paths to send back in result.files")
    env: dict[str, str] = Field(default_factory=dict,
                                json_schema_extra={"maxProperties": _L.env},
                                description=f"extra environment; at most {_L.env} entries and "
                                            f"{_L.env_bytes} bytes (node limits.env, "
                                            "limits.env_bytes)")
    timeout: float = Field(10.0, gt=0, le=3600, description="wall-clock seconds for the call")
    cpu_time_s: float | None = Field(None, gt=0, le=3600,
                                     description="CPU seconds per process; default: timeout")
    memory_mb: int = Field(256, ge=16, le=65536, description="memory of the worker, MiB")
    disk_mb: int = Field(64, ge=1, le=65536, description="bytes the call may write, MiB")
    pids: int = Field(64, ge=1, le=4096, description="processes and threads of the call")
    max_output: int = Field(1 << 20, ge=0, le=1 << 28, description="cap per stream, bytes")
    compile_args: list[str] = Field(default_factory=list, max_length=256,
                                    description="extra compiler flags for c and cpp")

    @field_validator("argv", "compile_args")
    @classmethod
    def _argv(cls, v: list[str], info) -> list[str]:
        return check_argv(v, info.field_name)

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        return check_env(v)

    @model_validator(mode="after")
    def _check(self) -> FnCallRequest:
        if (self.code is None) == (self.callable is None):
            raise ValueError("give exactly one of code or callable")
        if self.callable is not None and self.language != "python":
            raise ValueError(f"a callable runs in python; got language={self.language!r}")
        self.files = {_relative(k): v for k, v in self.files.items()}
        self.return_files = [_relative(p) for p in self.return_files]
        return self


class RemoteErrorInfo(BaseModel):
    """An exception raised inside a called function."""

    type: str
    message: str
    traceback: str


class FnCallResult(ProcessOutcome):
    """What one call did. A non-zero exit, a timeout or an OOM kill is a result, not an error."""

    signal: int | None = Field(None, description="signal that ended the program, if any")
    compile_failed: bool = False
    files: dict[str, Blob] = Field(default_factory=dict,
                                   description="requested files that the call left behind")
    value: Blob | None = Field(None, description="cloudpickle of a callable's return value")
    error: RemoteErrorInfo | None = Field(None, description="a callable's exception")
    worker: str = Field("", description="id of the worker that ran the call")

    def result(self):
        """A callable's return value, unpickled; its exception as :class:`RemoteError`."""
        if self.error is not None:
            raise RemoteError(f"{self.error.type}: {self.error.message}", self.error.type,
                              self.error.traceback)
        if self.value is None:
            if self.timed_out:
                raise SandboxTimeout(f"the call ran past its limit (worker {self.worker})")
            why = "ran out of memory" if self.oom_killed else \
                f"ended with exit {self.exit_code}, signal {self.signal}"
            raise RemoteError(f"the call {why} before returning", "WorkerError", self.stderr)
        import cloudpickle
        return cloudpickle.loads(self.value)


class FnCallBatch(RequestModel):
    """Many calls in one request; they run concurrently over the pools."""

    calls: list[FnCallRequest] = Field(min_length=1, max_length=10000)


class FnCallBatchResult(BaseModel):
    results: list[FnCallResult]

