"""Job routes: a job is the set of sandboxes created with the same ``job=`` name, on
whichever nodes they are; each verb fans out to every healthy node."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request

from dsec.api.errors import NotFound
from dsec.api.rl import HeartbeatRequest, JobInfo, JobList
from dsec.gateway.routes.common import gateway_of
from dsec.gateway.spread import healthy_clients
from dsec.rl.jobs import merge_job_infos

__all__ = ["router"]

router = APIRouter(prefix="/v1/jobs")


async def _all(request: Request) -> list[JobInfo]:
    clients, _ = healthy_clients(gateway_of(request))
    parts = await asyncio.gather(*(c.jobs() for c in clients))
    return merge_job_infos([{j.job: j for j in part} for part in parts])


async def _one(request: Request, job: str) -> JobInfo:
    found = [j for j in await _all(request) if j.job == job]
    if not found:
        raise NotFound(f"job {job!r} has no sandboxes and no lease")
    return found[0]


async def _each(request: Request, verb: str, *args) -> None:
    clients, _ = healthy_clients(gateway_of(request))
    await asyncio.gather(*(getattr(c, verb)(*args) for c in clients))


@router.get("", response_model=JobList)
async def list_jobs(request: Request) -> JobList:
    return JobList(jobs=await _all(request))


@router.get("/{job}", response_model=JobInfo)
async def get_job(request: Request, job: str) -> JobInfo:
    return await _one(request, job)


@router.post("/{job}/pause", response_model=JobInfo)
async def pause(request: Request, job: str) -> JobInfo:
    await _each(request, "job_pause", job)
    return await _one(request, job)


@router.post("/{job}/resume", response_model=JobInfo)
async def resume(request: Request, job: str) -> JobInfo:
    await _each(request, "job_resume", job)
    return await _one(request, job)


@router.delete("/{job}", status_code=204)
async def stop(request: Request, job: str) -> None:
    await _each(request, "job_stop", job)


@router.post("/{job}/heartbeat", response_model=JobInfo)
async def heartbeat(request: Request, job: str, req: HeartbeatRequest) -> JobInfo:
    await _each(request, "job_heartbeat", job, req.lease_s, req.stop_after_s)
    return await _one(request, job)
