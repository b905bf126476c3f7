"""Wire models of background processes and of a sandbox's life (its timeout).

A background process is started by the node and outlives the request that started it: its
output is kept (up to ``max_output`` per stream), it can be waited for, signalled, fed
stdin and followed from any client by its pid (E2B's ``commands.run(background=True)``,
``commands.connect(pid)``, ``commands.list()``; Modal's ``sb.exec`` handle).
"""

from __future__ import annotations

import base64
import binascii
import signal as _signal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from dsec.api.limits import MAX_LIFE_S, RequestModel
from dsec.api.models import ExecRequest, ExecResult

__all__ = ["ProcessRequest", "ProcessInfo", "ProcessList", "ProcessWaitRequest",
           "SignalRequest", "StdinRequest", "TimeoutRequest", "PtySize", "MAX_TIMEOUT_S"]

MAX_TIMEOUT_S = MAX_LIFE_S  # a sandbox's life may be extended at most this far ahead


class PtySize(RequestModel):
    """A terminal's size (a PTY process at start, or resized)."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"rows": 24, "cols": 80}]})

    rows: int = Field(24, ge=1, le=1000, description="lines")
    cols: int = Field(80, ge=1, le=1000, description="columns")


class ProcessRequest(ExecRequest):
    """A command started in the background; its ``timeout`` (None: none) still applies."""

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"cmd": "python3 -m http.server 8000", "cwd": "/srv", "stdin_open": False}]})

    timeout: float | None = Field(None, gt=0, le=MAX_LIFE_S,
                                  description="seconds before the process group is killed; "
                                              "None (the default) for no limit")
    stdin_open: bool = Field(False, description="keep stdin open for later writes "
                                                "(POST .../stdin) after ``stdin`` is sent")
    background: bool = Field(False, description="ignored: a process is always background")
    pty: PtySize | None = Field(None, description="run it on a pseudo-terminal of this size: "
                                                  "stdout and stderr come as one stdout "
                                                  "stream, stdin stays open for input")


class ProcessInfo(BaseModel):
    """A background process as the node keeps it."""

    pid: int = Field(description="its pid inside the sandbox; the handle's key")
    cmd: str | list[str]
    started_at: float
    running: bool
    pty: bool = Field(False, description="it runs on a pseudo-terminal (started with pty)")
    result: ExecResult | None = Field(None, description="once it ended: exit code, timing "
                                                        "(its output is in stdout/stderr)")
    stdout: str = Field("", description="output kept so far (empty in a list)")
    stderr: str = ""
    stdout_truncated: bool = Field(False, description="output passed max_output and the "
                                                      "rest was dropped")
    stderr_truncated: bool = False


class ProcessList(BaseModel):
    processes: list[ProcessInfo]


class ProcessWaitRequest(RequestModel):
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"timeout": 30}]})

    timeout: float | None = Field(None, ge=0, le=86400,
                                  description="answer after this many seconds even if it "
                                              "still runs (running stays true); None: wait")


class SignalRequest(RequestModel):
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"signal": 15}]})

    signal: int = Field(int(_signal.SIGKILL), ge=1, le=64,
                        description="signal number sent to the process group (9 = SIGKILL)")


class StdinRequest(RequestModel):
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"data": "aGVsbG8K", "close": False}]})

    data: str = Field("", description="bytes to write, base64-encoded")
    close: bool = Field(False, description="close stdin after writing")

    @field_validator("data")
    @classmethod
    def _b64(cls, v: str) -> str:
        try:
            base64.b64decode(v, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"must be base64 (RFC 4648, with padding): {exc}") from None
        return v


class TimeoutRequest(RequestModel):
    """Set a running sandbox's remaining life (E2B's ``set_timeout``)."""

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"timeout_s": 1800}]})

    timeout_s: float = Field(gt=0, le=MAX_TIMEOUT_S,
                             description="the sandbox stops this many seconds from now")
