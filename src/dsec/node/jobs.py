"""Job lifecycle on a node: pause, stop and count a job's sandboxes; leases that lapse.

A trainer holding a lease renews it with heartbeats. When a lease lapses (the trainer was
preempted) the job's sandboxes are paused, keeping every process and file; when it stays
lapsed ``stop_after_s`` longer, they are stopped. The next request to a paused sandbox
resumes it, and a heartbeat renews the lease. Leases live in the node's store, so they
survive a restart of the node agent.

A job is named by its project and its name: the lease a token renews is its project's
(:data:`~dsec.api.scope.caller_scope`), seen only by tokens that see that project, and when
it lapses it pauses or stops only the sandboxes that project's tokens would.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Literal

from dsec.api.rl import JobInfo
from dsec.api.scope import caller_scope, visible

if TYPE_CHECKING:
    from dsec.node.service import NodeService

__all__ = ["Lease", "lease_action", "JobLeases", "pause_job", "resume_job", "stop_job",
           "job_infos", "reap_leases"]


@dataclass
class Lease:
    job: str
    expires_at: float
    stop_after_s: float | None
    lapsed: bool = False  # the job was paused for it
    project: str | None = None  # whose lease: the scope it acts in (None: the root's)

    @property
    def stop_at(self) -> float | None:
        return None if self.stop_after_s is None else self.expires_at + self.stop_after_s


def lease_action(lease: Lease, now: float) -> Literal["keep", "pause", "stop"]:
    """What a lease calls for at ``now``; pure."""
    if now < lease.expires_at:
        return "keep"
    if lease.stop_at is not None and now >= lease.stop_at:
        return "stop"
    return "keep" if lease.lapsed else "pause"


def _key(project: str | None, job: str) -> str:
    return f"{project or ''}\0{job}"


class JobLeases:
    """The leases of one node by (project, job), persisted as one JSON value in the node's
    store (leases written before they had a project are the root's)."""

    KEY = "job_leases"

    def __init__(self, store) -> None:
        self.store = store
        raw = store.meta(self.KEY)
        leases = [Lease(**v) for v in (json.loads(raw) if raw else {}).values()]
        self.leases: dict[str, Lease] = {_key(x.project, x.job): x for x in leases}

    def renew(self, job: str, now: float, lease_s: float, stop_after_s: float | None) -> Lease:
        """The caller's project's lease of ``job``, renewed."""
        project = caller_scope.get()
        lease = self.leases[_key(project, job)] = Lease(job, now + lease_s, stop_after_s,
                                                        project=project)
        self._save()
        return lease

    def drop(self, job: str) -> None:
        """The leases of ``job`` the caller sees (its project's and those below it)."""
        mine = [k for k, x in self.leases.items() if x.job == job and visible(x.project)]
        for k in mine:
            del self.leases[k]
        if mine:
            self._save()

    def _save(self) -> None:
        self.store.set_meta(self.KEY, json.dumps({k: asdict(v) for k, v in self.leases.items()}))


def _leases(node: NodeService) -> JobLeases:
    # Kept on the node object, made on first use: the node service need not know leases.
    leases = getattr(node, "_job_leases", None)
    if leases is None:
        leases = node._job_leases = JobLeases(node.store)
    return leases


def _ids(node: NodeService, job: str, states: tuple[str, ...]) -> list[str]:
    return [r.id for r in node.records.values()
            if r.spec.job == job and r.state in states and visible(r.spec.project)]


async def pause_job(node: NodeService, job: str) -> int:
    """Pause every running sandbox of ``job``; returns how many were paused."""
    ids = _ids(node, job, ("running",))
    await asyncio.gather(*(node.pause(i) for i in ids))
    return len(ids)


async def resume_job(node: NodeService, job: str) -> int:
    ids = _ids(node, job, ("paused",))
    await asyncio.gather(*(node.resume(i) for i in ids))
    return len(ids)


async def stop_job(node: NodeService, job: str) -> int:
    ids = _ids(node, job, ("starting", "running", "paused"))
    await asyncio.gather(*(node.stop(i) for i in ids), return_exceptions=True)
    _leases(node).drop(job)
    return len(ids)


def heartbeat(node: NodeService, job: str, now: float, lease_s: float,
              stop_after_s: float | None) -> Lease:
    return _leases(node).renew(job, now, lease_s, stop_after_s)


def job_infos(node: NodeService) -> dict[str, JobInfo]:
    """This node's share of each job (and of each job holding a lease but no sandbox)."""
    out: dict[str, JobInfo] = {}
    for rec in node.records.values():
        if rec.spec.job is None or not visible(rec.spec.project):
            continue
        info = out.setdefault(rec.spec.job, JobInfo(job=rec.spec.job, sandboxes=0))
        info.sandboxes += 1
        info.states[rec.state] = info.states.get(rec.state, 0) + 1
        info.cpu += rec.spec.cpu
        info.memory_mb += rec.spec.memory_mb
        try:
            info.memory_used_mb += node.backends[rec.spec.backend].memory_bytes(rec) / (1 << 20)
        except (OSError, KeyError, ValueError):
            pass
    for lease in _leases(node).leases.values():
        if not visible(lease.project):
            continue
        info = out.setdefault(lease.job, JobInfo(job=lease.job, sandboxes=0))
        info.lease_expires_at, info.stop_at = lease.expires_at, lease.stop_at
    return out


async def reap_leases(node: NodeService, now: float) -> None:
    """Pause the jobs whose lease lapsed, stop those lapsed past their stop time: each in
    its lease's project, as a token of that project would."""
    leases = _leases(node)
    for lease in list(leases.leases.values()):
        action = lease_action(lease, now)
        if action == "keep":
            continue
        mark = caller_scope.set(lease.project)
        try:
            if action == "pause":
                await pause_job(node, lease.job)
                lease.lapsed = True
                leases._save()
            else:
                await stop_job(node, lease.job)
        finally:
            caller_scope.reset(mark)
