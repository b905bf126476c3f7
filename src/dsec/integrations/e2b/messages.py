"""The envd messages dsec serves, hand-written from E2B's ``spec/envd/{process,filesystem}``
``.proto`` files in their canonical protobuf-JSON form.

Decision: hand-written pydantic models rather than generated protobuf code. The SDK speaks
the JSON codec only, so the server needs the JSON mapping, not the binary one; a model per
message is a few lines, keeps dsec free of a protobuf runtime, and validates requests with
the same machinery as every other dsec route. The mapping rules kept here: field names in
lowerCamelCase on output, either spelling accepted on input; ``bytes`` as base64; 64-bit
integers as strings; enums by name (numbers accepted on input); a ``oneof`` as whichever
one field is present; unknown fields ignored (what the SDK's own codec does, so a newer
SDK's extra fields do not break it).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

__all__ = ["ProcessConfig", "StartRequest", "ProcessSelector", "ConnectRequest",
           "SendSignalRequest", "ProcessInfo", "ListResponse", "Empty", "PathRequest",
           "ListDirRequest", "MoveRequest", "EntryInfo", "SIGNALS", "PtySize", "PTY",
           "ProcessInput", "SendInputRequest", "CloseStdinRequest", "UpdateRequest",
           "StreamInputRequest", "WatchRequest", "WatcherRequest"]


class _Message(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True,
                              extra="ignore")


class Empty(_Message):
    """Any message without fields (ListRequest, the responses that carry nothing)."""


# ---- process.Process ----

class ProcessConfig(_Message):
    cmd: str = Field(min_length=1)
    args: list[str] = []
    envs: dict[str, str] = {}
    cwd: str | None = None


class PtySize(_Message):
    rows: int = Field(24, ge=1, le=1000)
    cols: int = Field(80, ge=1, le=1000)


class PTY(_Message):
    size: PtySize = PtySize()


class StartRequest(_Message):
    process: ProcessConfig
    pty: PTY | None = None
    tag: str | None = None
    stdin: bool | None = None


class ProcessSelector(_Message):
    pid: int | None = Field(None, ge=0, le=(1 << 32) - 1)
    tag: str | None = None


class ConnectRequest(_Message):
    process: ProcessSelector


class ProcessInput(_Message):
    """One of ``stdin`` or ``pty``: bytes, base64 in protobuf JSON."""

    stdin: str | None = None
    pty: str | None = None


class SendInputRequest(_Message):
    process: ProcessSelector
    input: ProcessInput = ProcessInput()


class CloseStdinRequest(_Message):
    process: ProcessSelector


class UpdateRequest(_Message):
    process: ProcessSelector
    pty: PTY | None = None


class StreamInputStart(_Message):
    process: ProcessSelector


class StreamInputData(_Message):
    input: ProcessInput = ProcessInput()


class StreamInputRequest(_Message):
    """One message of the StreamInput client stream: start first, then data (or keepalive)."""

    start: StreamInputStart | None = None
    data: StreamInputData | None = None
    keepalive: dict | None = None


SIGNALS = {"SIGNAL_SIGKILL": "KILL", "SIGNAL_SIGTERM": "TERM", 9: "KILL", 15: "TERM"}


class SendSignalRequest(_Message):
    process: ProcessSelector
    signal: Literal["SIGNAL_UNSPECIFIED", "SIGNAL_SIGTERM", "SIGNAL_SIGKILL", 0, 9, 15] = \
        "SIGNAL_UNSPECIFIED"


class ProcessInfo(_Message):
    config: ProcessConfig
    pid: int
    tag: str | None = None


class ListResponse(_Message):
    processes: list[ProcessInfo] = []


# ---- filesystem.Filesystem ----

class PathRequest(_Message):
    """StatRequest, MakeDirRequest and RemoveRequest: a path and nothing else."""

    path: str = Field(min_length=1, max_length=4096)


class ListDirRequest(PathRequest):
    depth: int = Field(0, ge=0, le=1 << 32)


class MoveRequest(_Message):
    source: str = Field(min_length=1, max_length=4096)
    destination: str = Field(min_length=1, max_length=4096)


class WatchRequest(PathRequest):
    """WatchDirRequest and CreateWatcherRequest."""

    recursive: bool = False
    include_entry: bool = False
    allow_network_mounts: bool = False


class WatcherRequest(_Message):
    """GetWatcherEventsRequest and RemoveWatcherRequest."""

    watcher_id: str = Field(min_length=1, max_length=128)


FileType = Literal["FILE_TYPE_UNSPECIFIED", "FILE_TYPE_FILE", "FILE_TYPE_DIRECTORY",
                   "FILE_TYPE_SYMLINK"]


class EntryInfo(_Message):
    name: str
    type: FileType
    path: str
    size: str  # int64: a string in protobuf JSON
    mode: int
    permissions: str
    owner: str | None = None
    group: str | None = None
    modified_time: str  # google.protobuf.Timestamp, RFC 3339
    symlink_target: str | None = None

    @field_validator("size", mode="before")
    @classmethod
    def _size(cls, v: object) -> str:
        return str(v)
