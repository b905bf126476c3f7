"""Wire models shared by the SDK, the gateway and the node agent.

Every request and response that crosses a process boundary is one of these models; no
hand-built dict shapes. Requests forbid unknown fields so a typo is an error, not a no-op.
"""

from __future__ import annotations

import base64
import binascii
import functools
import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from dsec.api.projects import check_project_path
from dsec.api.limits import (DEFAULT_LIMITS as _L, MAX_LIFE_S, RequestModel, check_argv,
                             check_cmd, check_env, check_labels, check_path, check_user)

__all__ = [
    "retry_mismatch",
    "Backend",
    "SandboxState",
    "NetworkPolicy",
    "SandboxSpec",
    "CreateManyRequest",
    "SandboxInfo",
    "SandboxList",
    "CreateManyResponse",
    "TarWritten",
    "ExecRequest",
    "ProcessOutcome",
    "ExecResult",
    "ExecEvent",
    "ShellInfo",
    "ShellRunRequest",
    "FileInfo",
    "FileList",
    "ImageSummary",
    "NodeInfo",
    "PackDiffRequest",
    "InputRequest",
    "MAX_OUTPUT_DEFAULT",
    "validated",
    "validated_json",
    "describe",
]

Backend = Literal["container", "microvm", "vm", "fncall"]
SandboxState = Literal["starting", "running", "paused", "stopped", "failed"]
MAX_OUTPUT_DEFAULT = 1 << 20
MAX_PROTECTED = 64  # the agent's own bound (protect.h MAX_PROTECT)


def validated(cls, /, **fields):
    """Build a request model; a bad argument raises :class:`InvalidArgument`, whose message
    names each field and what to change (the same text the server would send)."""
    from pydantic import ValidationError

    from dsec.api.errors import InvalidArgument
    try:
        return cls(**fields)
    except ValidationError as exc:
        raise InvalidArgument(describe(exc)) from None


def validated_json(cls, body: bytes, /):
    """Parse a request model from JSON text, failing like :func:`validated`."""
    from pydantic import ValidationError

    from dsec.api.errors import InvalidArgument
    try:
        return cls.model_validate_json(body)
    except ValidationError as exc:
        raise InvalidArgument(describe(exc)) from None


def describe(exc) -> str:
    """A validation error as one line per field: where, and what to change."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts) or "invalid request"


_Request = RequestModel


@functools.cache
def _cores() -> float:
    """This machine's cores, read once: ``os.cpu_count`` reads a sysfs file per call
    (15 µs, twice per create through a gateway)."""
    return float(os.cpu_count() or 1)

_ENV_DOC = (f"at most {_L.env} entries and {_L.env_bytes} bytes (node limits.env, "
            f"limits.env_bytes); keys non-empty, without '='")
_ENV_SCHEMA = {"maxProperties": _L.env}


class NetworkPolicy(_Request):
    """Egress by named permissions; ``{}`` (or ``"none"``) means loopback only."""

    allow: dict[str, bool] = Field(default_factory=dict,
                                   description="permission name -> allowed, e.g. {'pypi': True}")


class SandboxSpec(_Request):
    """Everything needed to create one sandbox."""

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"backend": "container", "image": "busybox", "cpu": 1, "memory_mb": 512,
         "ttl_s": 3600, "job": "run-17", "labels": {"task": "swe-42"}}]})

    backend: Backend = Field("container", description="which isolation backend runs it")
    image: str = Field("busybox", min_length=1, max_length=256,
                       description="image name or tag, e.g. 'busybox' or 'python:3.11'")
    layers: list[str] = Field(default_factory=list, max_length=32,
                              description="extra layer tags stacked on the image, bottom first")
    cpu: float = Field(1.0, description="CPU cores (a CFS quota); 0.05 up to the node's cores")
    memory_mb: int = Field(512, description="memory limit in MiB, swap included; 16 to 65536")
    disk_mb: int = Field(1024, ge=1, le=1 << 20,
                         description="size limit of the writable layer in MiB")
    pids: int = Field(512, ge=8, le=32768, description="maximum number of processes")
    ttl_s: float | None = Field(3600.0, gt=0, le=MAX_LIFE_S,
                                description="maximum life in seconds, at most 30 days "
                                            "(limits.MAX_LIFE_S); None for no limit")
    idle_ttl_s: float | None = Field(None, gt=0, le=MAX_LIFE_S,
                                     description="stop (or pause) after this long with no "
                                                 "request; at most 30 days")
    on_idle: Literal["stop", "pause"] = Field("stop", description="what idle_ttl_s does")
    idle_reclaim_s: float | None = Field(
        None, ge=0, le=MAX_LIFE_S,
        description="after this long with no request, its cold memory is pushed to swap "
                    "while it runs; None: the node's default; 0: never")
    cpu_class: Literal["latency", "best_effort"] = Field(
        "latency", description="'latency': its cores when it wants them; 'best_effort': runs "
                               "SCHED_IDLE on what latency-class sandboxes leave idle")
    network: Literal["none"] | dict[str, bool] = Field(
        "none", description="'none' (loopback only) or named egress permissions")
    job: str | None = Field(None, max_length=128, description="job this sandbox belongs to")
    labels: dict[str, str] = Field(
        default_factory=dict, json_schema_extra={"maxProperties": _L.labels},
        description=f"free-form labels: at most {_L.labels}, keys of 1 to "
                    f"{_L.label_key_bytes} bytes, values up to {_L.label_value_bytes} bytes "
                    "(node limits.labels, limits.label_key_bytes, limits.label_value_bytes)")
    env: dict[str, str] = Field(default_factory=dict, json_schema_extra=_ENV_SCHEMA,
                                description=f"extra environment; {_ENV_DOC}")
    request_id: str | None = Field(
        None, min_length=1, max_length=128,
        description="idempotency key: a create retried with the same request_id returns the "
                    "sandbox the first attempt made instead of making another")
    protected_paths: list[str] = Field(
        default_factory=list, max_length=MAX_PROTECTED,
        description="absolute paths (and everything under them) that commands may neither "
                    "read nor write, root included (Landlock); only an exec with "
                    "grading=True reaches them. The directories on the way to them can be "
                    "walked through but not listed or changed")

    @field_validator("protected_paths")
    @classmethod
    def _protected(cls, v: list[str]) -> list[str]:
        return [check_protected_path(p) for p in v]
    project: str | None = Field(
        None, max_length=1100,
        description="the project the sandbox belongs to: the token's own by default, or a "
                    "project below it")
    wait_s: float = Field(0.0, ge=0, le=600,
                          description="how long the gateway may queue the create (FIFO per "
                                      "project) for quota or room before it answers "
                                      "quota_exceeded or capacity; 0 fails at once")

    @field_validator("project")
    @classmethod
    def _project(cls, v: str | None) -> str | None:
        return v if v is None else check_project_path(v)

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        return check_labels(v)

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        return check_env(v)

    @field_validator("cpu")
    @classmethod
    def _cpu_range(cls, v: float) -> float:
        top = _cores()
        if not 0.05 <= v <= top:
            raise ValueError(f"cpu must be between 0.05 and {top:g} (this node's cores); got {v:g}")
        return v

    @field_validator("memory_mb")
    @classmethod
    def _memory_range(cls, v: int) -> int:
        if not 16 <= v <= 65536:
            raise ValueError(f"memory_mb must be between 16 and 65536; got {v}")
        return v


def check_protected_path(path: str) -> str:
    """A protected path as the agent takes it: absolute, normalised, not ``/`` nor dsec's."""
    check_path(path, "protected_paths")
    if not path.startswith("/") or "\x00" in path:
        raise ValueError(f"protected_paths entries must be absolute paths; got {path!r}")
    parts = [p for p in path.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise ValueError(f"protected_paths entries must not contain '.' or '..'; got {path!r}")
    if not parts:
        raise ValueError("protected_paths cannot hold '/': nothing could run; name the "
                         "directories to protect")
    if parts[0] in ("proc", "sys", "dev", ".dsec"):
        raise ValueError(f"protected_paths cannot be under /{parts[0]} (the sandbox's own "
                         f"system files); got {path!r}")
    return "/" + "/".join(parts)


class CreateManyRequest(_Request):
    """Create ``count`` sandboxes from one spec, placed and started concurrently."""

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"count": 32, "spec": {"image": "busybox", "memory_mb": 256, "job": "run-17"},
         "request_id": "ep3-batch"}]})

    count: int = Field(ge=1, le=100_000)
    spec: SandboxSpec = Field(default_factory=SandboxSpec)
    request_id: str | None = Field(
        None, min_length=1, max_length=120,
        description="idempotency key of the batch: a retry returns the sandboxes the first "
                    "attempt made and makes only those still missing")
    first_index: int = Field(0, ge=0, le=100_000,
                             description="index of this request's first item in its batch "
                                         "(a gateway splitting one batch over nodes sets it)")


class SandboxInfo(BaseModel):
    """A sandbox as the API reports it."""

    id: str
    node: str
    backend: Backend
    image: str
    layers: list[str] = []
    state: SandboxState
    cpu: float
    memory_mb: int
    disk_mb: int
    job: str | None = None
    request_id: str | None = None
    project: str = Field("", description="the project it belongs to ('' is the root)")
    labels: dict[str, str] = {}
    created_at: float
    expires_at: float | None = None
    last_active_at: float
    error: str | None = None
    protected_paths: list[str] = []
    memory_used_mb: float | None = Field(
        None, description="host memory the sandbox holds now (a container's cgroup usage; a "
                          "guest's QEMU Pss, pages KSM merged counted shared); set by get, "
                          "not by list")
    cpu_class: Literal["latency", "best_effort"] = "latency"
    memory_reclaimed_mb: float | None = Field(
        None, description="memory its last reclaim (while paused, or while idle) gave back "
                          "to the host")
    memory_swapped_mb: float | None = Field(
        None, description="of its memory, what its last reclaim left in swap")
    reclaim: str | None = Field(
        None, description="state of its reclaim while paused: reclaiming, reclaimed, partial "
                          "(with the reason), failed; while running and idle: idle "
                          "reclaiming, idle reclaimed (with the reason it stopped)")


class SandboxList(BaseModel):
    sandboxes: list[SandboxInfo]
    unreachable: list[str] = Field(default_factory=list,
                                   description="nodes that did not answer: their sandboxes "
                                               "are missing from this list")


class CreateManyResponse(BaseModel):
    """What a batch create made, and one message per item it could not."""

    sandboxes: list[SandboxInfo]
    errors: list[str]


class TarWritten(BaseModel):
    """How many entries a tar upload unpacked."""

    entries: int


class ExecRequest(_Request):
    """One command. ``cmd`` as a string runs under ``/bin/sh -c``; a list runs as argv."""

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"cmd": "echo hello; ls /", "cwd": "/tmp", "env": {"X": "1"}, "timeout": 10}]})

    cmd: str | list[str] = Field(
        description=f"shell string or argv list: at most {_L.argv} argv entries and "
                    f"{_L.cmd_bytes} bytes (node limits.argv, limits.cmd_bytes)")
    cwd: str | None = Field(None, description="working directory; the image's by default; "
                                              f"at most {_L.path_bytes} bytes")
    env: dict[str, str] = Field(default_factory=dict, json_schema_extra=_ENV_SCHEMA,
                                description=f"extra environment; {_ENV_DOC}")
    user: str | None = Field(None, max_length=256,
                             description="user name or uid[:gid] (ids 0 to 4294967294); "
                                         "the image's by default")
    stdin: str | None = Field(None, description="bytes fed to stdin, base64-encoded")
    timeout: float | None = Field(60.0, gt=0, le=86400,
                                  description="seconds before the process group is killed")
    max_output: int = Field(MAX_OUTPUT_DEFAULT, ge=0, le=1 << 30,
                            description="cap per stream in bytes; the rest is dropped")
    background: bool = Field(False, description="start and return at once; output discarded")
    step: str | None = Field(None, max_length=256, description="trajectory step key")
    grading: bool = Field(False, description="run as the grading step: the sandbox's "
                                             "protected_paths are readable and writable")

    @field_validator("cmd")
    @classmethod
    def _cmd_not_empty(cls, v: str | list[str]) -> str | list[str]:
        if not v or (isinstance(v, list) and not v[0]):
            raise ValueError("cmd must be a non-empty string or argv list")
        return check_cmd(v) if isinstance(v, str) else check_argv(v, "cmd")

    @field_validator("cwd")
    @classmethod
    def _cwd(cls, v: str | None) -> str | None:
        return v if v is None else check_path(v, "cwd")

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        return check_env(v)

    @field_validator("user")
    @classmethod
    def _user(cls, v: str | None) -> str | None:
        return v if v is None else check_user(v)

    @field_validator("stdin")
    @classmethod
    def _stdin(cls, v: str | None) -> str | None:
        if v:
            try:
                base64.b64decode(v, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise ValueError(f"must be base64 (RFC 4648, with padding): {exc}") from None
        return v


class ProcessOutcome(BaseModel):
    """What a finished program did: the fields every kind of run reports. A non-zero exit,
    a timeout or an OOM kill is an outcome, not an error."""

    exit_code: int
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_ms: float = 0.0
    timed_out: bool = False
    oom_killed: bool = Field(False, description=(
        "the kernel killed a process of the sandbox for memory during this run: the "
        "command, or (an exec's) child of it such as one stage of a pipeline, seen when "
        "the result shows a kill: a SIGKILL, exit status 137 or a shell's 'Killed' on "
        "stderr"))


class ExecResult(ProcessOutcome):
    """What a finished command did."""

    pid: int | None = None


class ExecEvent(BaseModel):
    """One line of a streamed exec: output chunks, then one ``exit`` carrying the result."""

    type: Literal["stdout", "stderr", "exit"]
    data: str = ""
    result: ExecResult | None = None


class ShellInfo(BaseModel):
    id: str
    sandbox_id: str


class ShellRunRequest(_Request):
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"cmd": "cd /repo && export X=1", "timeout": 10}]})

    cmd: str = Field(min_length=1, description=f"a line for the shell; at most {_L.cmd_bytes} "
                                               "bytes (node limits.cmd_bytes)")
    timeout: float | None = Field(60.0, gt=0, le=86400)
    max_output: int = Field(MAX_OUTPUT_DEFAULT, ge=0, le=1 << 30)
    step: str | None = Field(None, max_length=256)

    @field_validator("cmd")
    @classmethod
    def _cmd(cls, v: str) -> str:
        return check_cmd(v)


class FileInfo(BaseModel):
    path: str
    name: str
    type: Literal["file", "dir", "symlink", "other"]
    size: int
    mode: int
    mtime: float


class FileList(BaseModel):
    entries: list[FileInfo]


class ImageSummary(BaseModel):
    name: str
    digest: str
    layers: int
    size: int
    created: float | None = None
    project: str | None = Field(None, description="the project whose snapshot it is (made "
                                                  "by pack_diff with its token); None: shared "
                                                  "by every project")


class NodeInfo(BaseModel):
    id: str
    backends: list[str]
    cpus: int
    memory_mb: int
    sandboxes: int
    running: int | None = Field(description="None when the node does not answer")
    healthy: bool = Field(True, description="False: the gateway counts this node lost (no "
                                             "placements; its sandboxes answer node_lost); "
                                             "the figures are its last answer's")
    problem: str | None = Field(None, description="why the gateway counts it lost")
    memory_reserved_mb: int | None = Field(None, description="memory_mb of its sandboxes")
    cpu_reserved: float | None = Field(None, description="cpu of its sandboxes")
    memory_available_mb: int | None = Field(None, description="the host's MemAvailable")
    memory_reclaimed_mb: float | None = Field(
        None, description="given back by its paused sandboxes' reclaims")
    swap_mb: int | None = Field(None, description="swap on the host")
    swap_free_mb: int | None = Field(None, description="swap left on the host")
    cpu_used: float | None = Field(None, description="cores busy (last seconds)")
    memory_pressure: float | None = Field(
        None, description="PSI memory some avg10: % of time tasks stalled on memory")
    cpu_pressure: float | None = Field(None, description="PSI cpu some avg10")
    core_scheduling: str | None = Field(
        None, description="whether latency-class sandboxes get cores of their own, and why not")
    ksm: str | None = Field(None, description="KSM state: merging containers, and pages shared")


class PackDiffRequest(_Request):
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"tag": "workspace/myrepo:v1", "exclude": ["/tmp"]}]})

    tag: str = Field(min_length=1, max_length=256)
    exclude: list[str] = Field(default_factory=list, max_length=1024,
                               description="paths left out of the layer")

    @model_validator(mode="after")
    def _tag_shape(self) -> PackDiffRequest:
        if any(c.isspace() for c in self.tag):
            raise ValueError(f"tag must not contain whitespace; got {self.tag!r}")
        return self


class InputRequest(_Request):
    """Keyboard and mouse input for a sandbox with a display (``backend="vm"``)."""

    text: str | None = Field(None, max_length=10000, description="text to type (US layout)")
    keys: list[str] = Field(default_factory=list, max_length=16,
                            description="a chord of key names pressed together, e.g. ['ctrl','c']")
    click: tuple[int, int] | None = Field(None, description="(x, y) in screen pixels to click")
    button: Literal["left", "right", "middle"] = Field("left", description="mouse button")


KEYED_FIELDS = ("backend", "image", "cpu", "memory_mb", "disk_mb", "job")


def retry_mismatch(spec: SandboxSpec, made: SandboxSpec | SandboxInfo) -> str | None:
    """How a create retried with a ``request_id`` asks for another sandbox than the one
    that key made (``made``), or None: a retry must ask for the same, or it would be
    handed a sandbox it did not ask for. Pure."""
    diff = [f"{f} {getattr(made, f)!r}, not {getattr(spec, f)!r}" for f in KEYED_FIELDS
            if getattr(made, f) != getattr(spec, f)]
    if not diff:
        return None
    return (f"request_id {str(spec.request_id)[:80]!r} made a sandbox with "
            f"{'; '.join(diff)}: a retry sends the same spec; use another request_id for "
            "another sandbox")
