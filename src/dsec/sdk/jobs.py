"""Jobs as the asynchronous SDK sees them: ``client.jobs.pause("run-17")``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsec.api.models import validated
from dsec.api.rl import HeartbeatRequest, JobInfo, JobList
from dsec.sdk.boundary import guarded, parse
from dsec.sdk.listing import Listing
from dsec.sdk.sandbox import AsyncSandbox

if TYPE_CHECKING:
    from dsec.sdk.client import AsyncClient

__all__ = ["AsyncJobs"]


@guarded
class AsyncJobs:
    """The jobs of a cluster: every sandbox created with ``job=name`` belongs to ``name``."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def list(self) -> Listing[JobInfo]:
        """Every job with sandboxes or a lease, with counts by state and usage; on a
        cluster, ``unreachable`` names the nodes that did not answer."""
        resp = await self._client._request("GET", "/v1/jobs")
        page = parse(JobList, resp)
        return Listing(page.jobs, page.unreachable)

    async def get(self, job: str) -> JobInfo:
        resp = await self._client._request("GET", f"/v1/jobs/{job}")
        return parse(JobInfo, resp)

    async def attach(self, job: str) -> list[AsyncSandbox]:
        """Reconnect to every sandbox of the job (a trainer back from preemption)."""
        return [AsyncSandbox(self._client, info) for info in await self._client.list(job=job)]

    async def pause(self, job: str) -> JobInfo:
        """Freeze every sandbox of the job (the trainer went away); files and processes stay.
        The next request to any of them resumes that one."""
        resp = await self._client._request("POST", f"/v1/jobs/{job}/pause", timeout=None)
        return parse(JobInfo, resp)

    async def resume(self, job: str) -> JobInfo:
        """Thaw every paused sandbox of the job at once."""
        resp = await self._client._request("POST", f"/v1/jobs/{job}/resume", timeout=None)
        return parse(JobInfo, resp)

    async def stop(self, job: str) -> None:
        """Stop every sandbox of the job and drop its lease. :class:`NodeLost` when nodes
        did not answer: the job's sandboxes there still run."""
        await self._client._request("DELETE", f"/v1/jobs/{job}", timeout=None)

    async def heartbeat(self, job: str, lease_s: float = 60.0,
                        stop_after_s: float | None = 3600.0) -> JobInfo:
        """Renew the job's lease: without a heartbeat for ``lease_s`` the job is paused,
        and ``stop_after_s`` after that, stopped."""
        body = validated(HeartbeatRequest, lease_s=lease_s,
                         stop_after_s=stop_after_s).model_dump()
        resp = await self._client._request("POST", f"/v1/jobs/{job}/heartbeat", json=body)
        return parse(JobInfo, resp)
