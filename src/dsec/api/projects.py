"""Wire models of projects, quotas, tokens and the audit log, and the project path rules.

A project is named by its path, ``research/run-17/eval``: segments of letters, digits,
``.``, ``_`` and ``-`` joined by ``/``. The root project is the empty path ``""``; the
server's own token is its admin. Shared by the SDK, the gateway and the CLI.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, Field, field_validator

from dsec.api.limits import RequestModel

__all__ = [
    "Role",
    "ROLES",
    "Quota",
    "Usage",
    "ProjectCreate",
    "ProjectUpdate",
    "ProjectInfo",
    "ProjectList",
    "TokenCreate",
    "TokenInfo",
    "TokenCreated",
    "TokenList",
    "TokenRevoke",
    "AuditEntry",
    "ProjectAuditList",
    "check_project_path",
    "ancestors",
    "within",
    "MAX_DEPTH",
    "MAX_SANDBOXES",
    "MAX_CPU",
    "MAX_MEMORY_MB",
    "MAX_RATE",
]

Role = Literal["admin", "grader", "user", "viewer"]
# each may do what those before it may; ``grader`` is a user that may also run the grading
# step (``exec(..., grading=True)``), which reaches a sandbox's protected paths
ROLES: tuple[Role, ...] = ("viewer", "user", "grader", "admin")

MAX_DEPTH = 16          # levels below the root; deeper trees are a mistake, not a need
MAX_SEGMENT = 64        # characters of one path segment
MAX_SANDBOXES = 10**9   # bounds keep every sum of quotas inside SQLite's 64-bit integers
MAX_CPU = 10**7
MAX_MEMORY_MB = 10**12
MAX_RATE = 10**6
_SEGMENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")


def check_project_path(path: str, field: str = "project") -> str:
    """``path`` if it names a project (``""`` is the root), else ValueError saying why."""
    if path == "":
        return path
    segments = path.split("/")
    if len(segments) > MAX_DEPTH:
        raise ValueError(f"{field} is {len(segments)} levels deep; at most {MAX_DEPTH}")
    for i, seg in enumerate(segments):
        if seg == "":
            raise ValueError(f"{field} {path[:80]!r} has an empty segment (at {i}); write "
                             "paths like 'team/run-17', with no leading, trailing or "
                             "doubled '/'")
        if seg in (".", ".."):
            raise ValueError(f"{field} {path[:80]!r} contains {seg!r}; a project path names "
                             "each level, it cannot climb or stay")
        if len(seg) > MAX_SEGMENT or not _SEGMENT.match(seg):
            raise ValueError(f"{field} segment {seg[:80]!r} must be 1 to {MAX_SEGMENT} "
                             "letters, digits, '.', '_' or '-', not starting with '.' or '-'")
    return path


def ancestors(path: str) -> list[str]:
    """``"a/b"`` -> ``["", "a", "a/b"]``: the root first, the project itself last. Pure."""
    if path == "":
        return [""]
    parts = path.split("/")
    return [""] + ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def within(path: str, scope: str) -> bool:
    """Whether project ``path`` is ``scope`` or below it. Pure."""
    return scope == "" or path == scope or path.startswith(scope + "/")


class Quota(RequestModel):
    """What a project (with everything below it) may hold at once, and how fast it may
    create. A field left unset sets no limit of this project's own: its sub-tree is still
    bounded by the limits above it."""

    sandboxes: int | None = Field(None, ge=0, le=MAX_SANDBOXES,
                                  description="sandboxes existing at once")
    cpu: float | None = Field(None, ge=0, le=MAX_CPU, description="CPU cores reserved at once")
    memory_mb: int | None = Field(None, ge=0, le=MAX_MEMORY_MB,
                                  description="MiB of memory reserved at once")
    creations_per_s: float | None = Field(None, ge=0, le=MAX_RATE,
                                          description="sandbox creations per second "
                                                      "(bursts of one second's worth)")


class Usage(BaseModel):
    """What a project and everything below it hold now (sandboxes being created count)."""

    sandboxes: int = 0
    cpu: float = 0.0
    memory_mb: int = 0


class ProjectCreate(RequestModel):
    path: str = Field(min_length=1, max_length=MAX_DEPTH * (MAX_SEGMENT + 1),
                      description="the new project's path; its parent must exist")
    quota: Quota = Field(default_factory=Quota)

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        return check_project_path(v, "path")


class ProjectUpdate(RequestModel):
    quota: Quota


class ProjectInfo(BaseModel):
    id: str = Field(description="prj-...; tokens belong to the id, not the path")
    path: str
    quota: Quota
    usage: Usage = Field(default_factory=Usage, description="rolled up over sub-projects")
    given: Quota = Field(default_factory=Quota,
                         description="the sum of the sub-projects' quotas, per field")
    created_at: float


class ProjectList(BaseModel):
    projects: list[ProjectInfo]


class TokenCreate(RequestModel):
    role: Role = Field("user", description="at most the minting token's own role")
    ttl_s: float | None = Field(86400.0, gt=0, le=10 * 365 * 86400,
                                description="seconds until it expires, at most until the "
                                            "minting token expires (400 otherwise); None: "
                                            "never, or when the minting token expires if "
                                            "it does")
    name: str = Field("", max_length=128, description="a note saying whose it is")


class TokenInfo(BaseModel):
    id: str = Field(description="tok-...; what revoke_token takes")
    project: str
    role: Role
    name: str = ""
    created_at: float
    expires_at: float | None = None
    revoked_at: float | None = None
    created_by: str | None = Field(None, description="the id of the token that minted it "
                                                     "('root': the server's token; None: "
                                                     "minted before this was kept)")


class TokenCreated(TokenInfo):
    token: str = Field(description="the secret; shown this once, stored only as a hash")


class TokenList(BaseModel):
    tokens: list[TokenInfo]


class TokenRevoke(RequestModel):
    token: str = Field(min_length=1, max_length=256,
                       description="the token's id (tok-...) or its secret")


class AuditEntry(BaseModel):
    """One management call or refused request: who, what, when, and what came of it."""

    at: float
    project: str = Field(description="the project the call was about (or the caller's)")
    who: str = Field(description="the token's id, 'root', or 'unknown' (no valid token)")
    action: str = Field(description="e.g. 'POST /v1/projects'")
    target: str = ""
    outcome: str = Field(description="'ok', or the error code and message")


class ProjectAuditList(BaseModel):
    entries: list[AuditEntry]
