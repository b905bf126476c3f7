"""The control-plane bodies of E2B's REST API (``spec/openapi.yml``) that dsec serves.

Requests ignore fields dsec does not know (the SDK adds fields release by release), but
a field dsec knows and cannot honour is refused by name in :mod:`.control`.
"""

from __future__ import annotations

from datetime import datetime, timezone

from pydantic import BaseModel, ConfigDict, Field

from dsec.api.limits import MAX_LIFE_S
from dsec.api.models import SandboxInfo
from dsec.integrations.e2b.config import ENVD_VERSION

__all__ = ["NewSandbox", "TimeoutRequest", "ConnectRequest", "PauseRequest", "Created",
           "Detail", "Listed", "created", "detail", "listed", "rfc3339"]


class _Body(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")


class NewSandbox(_Body):
    """POST /sandboxes and /v2/sandboxes."""

    template_id: str = Field(alias="templateID", min_length=1, max_length=256)
    timeout: int | None = Field(None, ge=0, le=MAX_LIFE_S)
    metadata: dict[str, str] | None = None
    env_vars: dict[str, str] | None = Field(None, alias="envVars")
    auto_pause: bool | None = Field(None, alias="autoPause")
    allow_internet_access: bool | None = None
    network: dict | None = None
    mcp: dict | None = None
    iam: dict | None = None
    volume_mounts: list | None = Field(None, alias="volumeMounts")
    auto_resume: dict | None = Field(None, alias="autoResume")


class TimeoutRequest(_Body):
    timeout: int = Field(ge=1, le=MAX_LIFE_S)


class ConnectRequest(_Body):
    timeout: int | None = Field(None, ge=0, le=MAX_LIFE_S)


class PauseRequest(_Body):
    pass


class Created(BaseModel):
    """``Sandbox``: what create and connect answer."""

    templateID: str
    sandboxID: str
    clientID: str
    envdVersion: str = ENVD_VERSION
    envdAccessToken: str
    alias: str | None = None
    domain: str | None = None


class Listed(BaseModel):
    """``ListedSandbox``."""

    templateID: str
    sandboxID: str
    clientID: str
    alias: str | None = None
    startedAt: str
    endAt: str
    cpuCount: int
    memoryMB: int
    diskSizeMB: int
    state: str
    envdVersion: str = ENVD_VERSION
    metadata: dict[str, str] = {}


class Detail(Listed):
    """``SandboxDetail``: ``Listed`` and the access token (None, left out, for a caller
    that may only read: the token runs commands)."""

    envdAccessToken: str | None = None
    domain: str | None = None


def rfc3339(ts: float | None) -> str:
    when = datetime.fromtimestamp(ts if ts is not None else 253402214400, tz=timezone.utc)
    return when.isoformat().replace("+00:00", "Z")


def state_of(info: SandboxInfo) -> str:
    return "paused" if info.state == "paused" else "running"


def created(info: SandboxInfo, access_token: str) -> Created:
    return Created(templateID=info.image, sandboxID=info.id, clientID=info.node,
                   alias=info.image, envdAccessToken=access_token)


def listed(info: SandboxInfo) -> Listed:
    return Listed(templateID=info.image, sandboxID=info.id, clientID=info.node,
                  alias=info.image, startedAt=rfc3339(info.created_at),
                  endAt=rfc3339(info.expires_at), cpuCount=max(1, round(info.cpu)),
                  memoryMB=info.memory_mb, diskSizeMB=info.disk_mb, state=state_of(info),
                  metadata=info.labels)


def detail(info: SandboxInfo, access_token: str | None) -> Detail:
    return Detail(**listed(info).model_dump(), envdAccessToken=access_token)
