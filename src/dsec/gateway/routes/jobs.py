"""Job routes: a job is the set of sandboxes created with the same ``job=`` name."""

from __future__ import annotations

import asyncio
import time

from fastapi import APIRouter, Request

from dsec.api.errors import NotFound
from dsec.api.rl import HeartbeatRequest, JobInfo, JobList
from dsec.gateway.routes.common import cluster_of
from dsec.rl import jobs

__all__ = ["router"]

router = APIRouter(prefix="/v1/jobs")


def _one(request: Request, job: str) -> JobInfo:
    found = [j for j in jobs.merge_job_infos([jobs.job_infos(n)
                                              for n in cluster_of(request).nodes()])
             if j.job == job]
    if not found:
        raise NotFound(f"job {job!r} has no sandboxes and no lease")
    return found[0]


async def _each(request: Request, verb, job: str) -> None:
    await asyncio.gather(*(verb(n, job) for n in cluster_of(request).nodes()))


@router.get("", response_model=JobList)
async def list_jobs(request: Request) -> JobList:
    return JobList(jobs=jobs.merge_job_infos([jobs.job_infos(n)
                                              for n in cluster_of(request).nodes()]))


@router.get("/{job}", response_model=JobInfo)
async def get_job(request: Request, job: str) -> JobInfo:
    return _one(request, job)


@router.post("/{job}/pause", response_model=JobInfo)
async def pause(request: Request, job: str) -> JobInfo:
    await _each(request, jobs.pause_job, job)
    return _one(request, job)


@router.post("/{job}/resume", response_model=JobInfo)
async def resume(request: Request, job: str) -> JobInfo:
    await _each(request, jobs.resume_job, job)
    return _one(request, job)


@router.delete("/{job}", status_code=204)
async def stop(request: Request, job: str) -> None:
    await _each(request, jobs.stop_job, job)


@router.post("/{job}/heartbeat", response_model=JobInfo)
async def heartbeat(request: Request, job: str, req: HeartbeatRequest) -> JobInfo:
    now = time.time()
    for node in cluster_of(request).nodes():
        jobs.heartbeat(node, job, now, req.lease_s, req.stop_after_s)
    return _one(request, job)
