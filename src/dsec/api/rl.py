"""Wire models of the RL side of dsec: trajectory log, audit records, jobs, network policy.

Shared by the SDK, the gateway and the node like :mod:`dsec.api.models`; kept apart so the
sandbox models stay short.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from dsec.api.limits import MAX_LIFE_S, RequestModel

__all__ = [
    "StepKind",
    "TrajectoryEntry",
    "TrajectoryPage",
    "AuditRecord",
    "SandboxAuditList",
    "NetworkRequest",
    "NetworkStatus",
    "DeniedFlow",
    "HeartbeatRequest",
    "JobInfo",
    "JobList",
    "merge_job_infos",
]

StepKind = Literal["exec", "shell_run", "file_write", "pack_diff"]


_Request = RequestModel


class TrajectoryEntry(BaseModel):
    """One mutating call on a sandbox and what it returned, at position ``seq``."""

    sandbox_id: str
    seq: int = Field(description="position in the sandbox's log, from 0")
    step: str | None = Field(None, description="the caller's step key, if it gave one")
    kind: StepKind
    fingerprint: str = Field(description="hash of the request fields that define the step")
    request: dict
    result: dict
    at: float = Field(description="unix time the call finished")


class TrajectoryPage(BaseModel):
    entries: list[TrajectoryEntry]
    total: int = Field(description="entries in the whole log")


class AuditRecord(BaseModel):
    """An action the sandbox (or a client on its behalf) was refused."""

    sandbox_id: str
    at: float
    kind: str = Field(description="e.g. 'network_denied', 'trajectory_diverged'")
    detail: str
    count: int = 1


class SandboxAuditList(BaseModel):
    records: list[AuditRecord]


class NetworkRequest(_Request):
    """New egress permissions for a running sandbox; names come from the node's config."""

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"allow": {"pypi": True}}]})

    allow: dict[str, bool] = Field(default_factory=dict,
                                   description="permission name -> allowed; {} is loopback only")


class DeniedFlow(BaseModel):
    """A destination the sandbox tried and was refused, with how many packets."""

    address: str
    protocol: str
    port: int
    packets: int


class NetworkStatus(BaseModel):
    sandbox_id: str
    allow: dict[str, bool]
    address: str | None = Field(None, description="the sandbox's own address, if it has egress")
    dropped: int = Field(0, description="packets refused since the sandbox started")
    denied: list[DeniedFlow] = []
    denied_domains: dict[str, int] = Field(
        default_factory=dict, description="names the node's resolver refused to resolve "
                                          "(no granted permission lists them), with counts")


class HeartbeatRequest(_Request):
    """Renew a job's lease. When it lapses the job is paused; later, stopped."""

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"lease_s": 60, "stop_after_s": 3600}]})

    lease_s: float = Field(60.0, gt=0, le=86400,
                           description="pause the job's sandboxes if no heartbeat this long")
    stop_after_s: float | None = Field(3600.0, gt=0, le=MAX_LIFE_S,
                                       description="stop them this long after the lease lapsed "
                                                   "(at most 30 days)")


class JobInfo(BaseModel):
    """A job: the sandboxes carrying its name, their states and what they reserve."""

    job: str
    sandboxes: int
    states: dict[str, int] = {}
    cpu: float = 0.0
    memory_mb: int = Field(0, description="memory reserved by the job's sandboxes")
    memory_used_mb: float = Field(0.0, description="memory they are charged for now")
    lease_expires_at: float | None = None
    stop_at: float | None = Field(None, description="when a lapsed lease stops the job")
    unreachable: list[str] = Field(default_factory=list, description=(
        "nodes that did not answer: the job's sandboxes there are not counted (nor paused, "
        "resumed or given the heartbeat)"))


class JobList(BaseModel):
    jobs: list[JobInfo]
    unreachable: list[str] = Field(default_factory=list, description=(
        "nodes that did not answer: their sandboxes' jobs are not in the list"))


def merge_job_infos(parts: list[dict[str, JobInfo]]) -> list[JobInfo]:
    """Sum per-node shares into one record per job; pure."""
    out: dict[str, JobInfo] = {}
    for part in parts:
        for job, p in part.items():
            o = out.get(job)
            if o is None:
                out[job] = p.model_copy(deep=True)
                continue
            o.sandboxes += p.sandboxes
            for s, n in p.states.items():
                o.states[s] = o.states.get(s, 0) + n
            o.cpu += p.cpu
            o.memory_mb += p.memory_mb
            o.memory_used_mb += p.memory_used_mb
            o.lease_expires_at = o.lease_expires_at or p.lease_expires_at
            o.stop_at = o.stop_at or p.stop_at
    return sorted(out.values(), key=lambda j: j.job)
