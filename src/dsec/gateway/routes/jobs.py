"""Job routes: a job is the set of sandboxes created with the same ``job=`` name, on
whichever nodes they are; each verb fans out to every healthy node."""

from __future__ import annotations

from fastapi import APIRouter, Request

from dsec.api.errors import NodeLost, NotFound
from dsec.api.rl import HeartbeatRequest, JobInfo, JobList, merge_job_infos
from dsec.gateway.routes.common import gateway_of
from dsec.gateway.spread import fan_out, list_all

__all__ = ["router"]

router = APIRouter(prefix="/v1/jobs")


async def _all(request: Request) -> JobList:
    parts, down = await fan_out(gateway_of(request), "jobs")
    return JobList(jobs=merge_job_infos([{j.job: j for j in part} for part in parts]),
                   unreachable=down)


async def _one(request: Request, job: str, down: list[str] = ()) -> JobInfo:
    jobs = await _all(request)
    found = [j for j in jobs.jobs if j.job == job]
    unreachable = sorted({*down, *jobs.unreachable})
    if not found:
        raise NotFound(f"job {job!r} has no sandboxes and no lease" + (
            f" on the nodes that answer ({', '.join(unreachable)} did not)"
            if unreachable else ""))
    return found[0].model_copy(update={"unreachable": unreachable})


async def _each(request: Request, verb: str, *args) -> list[str]:
    """``verb`` on every node; the nodes it may not have reached."""
    return (await fan_out(gateway_of(request), verb, *args))[1]


@router.get("", response_model=JobList)
async def list_jobs(request: Request) -> JobList:
    return await _all(request)


@router.get("/{job}", response_model=JobInfo)
async def get_job(request: Request, job: str) -> JobInfo:
    return await _one(request, job)


@router.post("/{job}/pause", response_model=JobInfo)
async def pause(request: Request, job: str) -> JobInfo:
    return await _one(request, job, await _each(request, "job_pause", job))


@router.post("/{job}/resume", response_model=JobInfo)
async def resume(request: Request, job: str) -> JobInfo:
    return await _one(request, job, await _each(request, "job_resume", job))


@router.delete("/{job}", status_code=204)
async def stop(request: Request, job: str) -> None:
    gw = gateway_of(request)
    ending = await list_all(gw, job=job) if gw.projects is not None else None
    down = await _each(request, "job_stop", job)
    if ending is not None:  # their room back at once, as a sandbox's own stop gives it
        gw.projects.ledger.stopped(*(i.id for i in ending.sandboxes if i.node not in down))
        gw.projects.admission.freed()
    if down:
        raise NodeLost(f"job {job!r} stopped on the nodes that answer; node(s) "
                       f"{', '.join(down)} did not: its sandboxes there still run (stop it "
                       "again when they are back)")


@router.post("/{job}/heartbeat", response_model=JobInfo)
async def heartbeat(request: Request, job: str, req: HeartbeatRequest) -> JobInfo:
    down = await _each(request, "job_heartbeat", job, req.lease_s, req.stop_after_s)
    return await _one(request, job, down)
