"""The embedded cluster: one node agent in the gateway's own process.

:class:`LocalNodeClient` is the in-process :class:`~dsec.cluster.nodeclient.NodeClient`:
each verb calls the :class:`~dsec.node.service.NodeService` directly, with no HTTP hop.
It is also what a node agent's own HTTP API serves (the same gateway app over a
:class:`LocalCluster`), so :class:`~dsec.cluster.http.HttpNodeClient` on another machine
reaches exactly these methods.
"""

from __future__ import annotations

import asyncio
import io
import os
import posixpath
import time
from collections.abc import AsyncIterator, Iterator

from dsec.api.errors import Forbidden, NotFound, shorten
from dsec.api.fncall import FnCallRequest, FnCallResult
from dsec.api.models import (ExecEvent, ExecRequest, ExecResult, FileInfo, ImageSummary,
                             InputRequest, NodeInfo, PackDiffRequest, SandboxInfo,
                             SandboxSpec, ShellInfo, ShellRunRequest)
from dsec.api.process import ProcessInfo, ProcessRequest, PtySize, StdinRequest
from dsec.api.scope import caller_scope
from dsec.api.rl import AuditRecord, JobInfo, NetworkStatus, TrajectoryPage
from dsec.cluster.base import node_short_of
from dsec.node.config import NodeConfig
from dsec.node.network import audit_records, network_status, set_network
from dsec.node.protected import covering
from dsec.node.service import NodeService
from dsec.placement.admission import NodeLoad
from dsec.node import jobs as joblib
from dsec.trajectory.recorder import FileWriteTap

__all__ = ["LocalCluster", "LocalNodeClient", "MAX_TAR_BYTES"]

CHUNK = 1 << 20
MAX_TAR_BYTES = 8 << 30


class _HostFile:
    """A file opened by the node, read a chunk at a time in a worker thread."""

    def __init__(self, f) -> None:
        self.f = f
        try:  # a host file (containers) knows its size; a guest's stream does not
            self.size: int | None = os.fstat(f.fileno()).st_size
        except (AttributeError, OSError, io.UnsupportedOperation):
            self.size = None

    async def chunks(self) -> AsyncIterator[bytes]:
        with self.f:
            while chunk := await asyncio.to_thread(self.f.read, CHUNK):
                yield chunk


class _AgentPty:
    """A terminal process started through the in-sandbox agent."""

    def __init__(self, proc) -> None:
        self.proc = proc

    async def send(self, data: bytes) -> None:
        self.proc.write_stdin(data)
        await self.proc.drain()

    async def resize(self, rows: int, cols: int) -> None:
        self.proc.resize(rows, cols)
        await self.proc.drain()

    async def receive(self) -> bytes | int:
        kind, data = await self.proc.next_event()
        return self.proc.exit_code if kind == "exit" else data

    async def close(self) -> None:
        self.proc.send_signal(9)
        self.proc.close()


async def _pull(gen: Iterator[bytes]) -> AsyncIterator[bytes]:
    """A blocking generator, pulled a chunk at a time in a worker thread."""
    sentinel = object()
    while True:
        chunk = await asyncio.to_thread(next, gen, sentinel)
        if chunk is sentinel:
            return
        yield chunk


class _QueueReader:
    """A blocking file-like reader fed by the event loop (a request body -> tarfile)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, body: AsyncIterator[bytes]) -> None:
        self.loop, self.body, self.buf = loop, body.__aiter__(), bytearray()
        self.done = False

    def read(self, n: int = -1) -> bytes:
        # tarfile reads a few KiB at a time: one bytearray, consumed from the front (which
        # CPython does in place), holds at most a chunk ahead of the reader
        while not self.done and (n < 0 or len(self.buf) < n):
            chunk = asyncio.run_coroutine_threadsafe(self._next(), self.loop).result()
            if chunk is None:
                self.done = True
            else:
                self.buf += chunk
        n = len(self.buf) if n < 0 else min(n, len(self.buf))
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    async def _next(self) -> bytes | None:
        try:
            return await self.body.__anext__()
        except StopAsyncIteration:
            return None


class LocalNodeClient:
    """The node agent in this process, behind the NodeClient interface."""

    in_process = True  # it cannot stop answering while this process runs

    def __init__(self, node: NodeService) -> None:
        self.node = node
        self.node_id, self.short = node.node_id, node.short

    # ---- the node ----
    async def load(self) -> NodeLoad:
        return self.node.load()

    def load_now(self) -> NodeLoad:
        return self.node.load()

    async def node_info(self) -> NodeInfo:
        return await self.node.node_info()

    async def close(self) -> None:
        await self.node.close()

    # ---- sandboxes ----
    async def create(self, spec: SandboxSpec) -> SandboxInfo:
        return await self.node.create(spec)

    async def create_many(self, count: int, spec: SandboxSpec, request_id: str | None = None,
                          first_index: int = 0) -> tuple[list[SandboxInfo], list[str]]:
        return await self.node.create_many(count, spec, request_id, first_index)

    async def list(self, job: str | None = None, labels: dict[str, str] | None = None,
                   request_id: str | None = None) -> list[SandboxInfo]:
        return await self.node.list(job=job, labels=labels, request_id=request_id)

    async def get(self, sb_id: str) -> SandboxInfo:
        return await self.node.get(sb_id)

    async def stop(self, sb_id: str) -> None:
        await self.node.stop(sb_id)

    async def pause(self, sb_id: str) -> SandboxInfo:
        return await self.node.pause(sb_id)

    async def resume(self, sb_id: str) -> SandboxInfo:
        return await self.node.resume(sb_id)

    async def set_timeout(self, sb_id: str, timeout_s: float) -> SandboxInfo:
        return await self.node.set_timeout(sb_id, timeout_s)

    # ---- commands ----
    async def exec(self, sb_id: str, req: ExecRequest) -> ExecResult:
        return await self.node.exec(sb_id, req)

    def exec_stream(self, sb_id: str, req: ExecRequest) -> AsyncIterator[ExecEvent]:
        return self.node.exec_stream(sb_id, req)

    async def shell_open(self, sb_id: str) -> ShellInfo:
        return await self.node.shell_open(sb_id)

    # ---- background processes ----
    async def _processes_of(self, sb_id: str) -> None:
        self.node.record(sb_id)  # an unknown (or expired) sandbox says so
        await self.node.processes.ready(sb_id)  # followed again after a node restart

    async def process_start(self, sb_id: str, req: ProcessRequest) -> ProcessInfo:
        return await self.node.process_start(sb_id, req)

    async def process_list(self, sb_id: str) -> list[ProcessInfo]:
        await self._processes_of(sb_id)
        return self.node.processes.list(sb_id)

    async def process_get(self, sb_id: str, pid: int) -> ProcessInfo:
        await self._processes_of(sb_id)
        return self.node.processes.get(sb_id, pid)

    async def process_events(self, sb_id: str, pid: int, since: int
                             ) -> AsyncIterator[ExecEvent]:
        await self._processes_of(sb_id)
        async for ev in self.node.processes.events(sb_id, pid, since):
            yield ev

    async def process_wait(self, sb_id: str, pid: int, timeout: float | None) -> ProcessInfo:
        await self._processes_of(sb_id)
        return await self.node.processes.wait(sb_id, pid, timeout)

    async def process_signal(self, sb_id: str, pid: int, signal: int) -> None:
        await self._processes_of(sb_id)
        await self.node.processes.signal(sb_id, pid, signal)

    async def process_stdin(self, sb_id: str, pid: int, req: StdinRequest) -> None:
        await self._processes_of(sb_id)
        await self.node.processes.stdin(sb_id, pid, req.data, req.close)

    async def process_resize(self, sb_id: str, pid: int, size: PtySize) -> None:
        await self._processes_of(sb_id)
        await self.node.processes.resize(sb_id, pid, size.rows, size.cols)

    async def shell_run(self, sb_id: str, sh_id: str, req: ShellRunRequest) -> ExecResult:
        return await self.node.shell_run(sb_id, sh_id, req)

    async def shell_close(self, sb_id: str, sh_id: str) -> None:
        await self.node.shell_close(sb_id, sh_id)

    async def pty(self, sb_id: str, rows: int, cols: int) -> _AgentPty:
        return _AgentPty(await self.node.pty(sb_id, None, rows, cols))

    # ---- files ----
    async def _ops(self, sb_id: str, grading: bool):
        return await self.node.files(sb_id, grading)

    async def file_read(self, sb_id: str, path: str, grading: bool = False) -> _HostFile:
        ops = await self._ops(sb_id, grading)
        return _HostFile(await asyncio.to_thread(ops.open_read, path))

    async def file_write(self, sb_id: str, path: str, mode: int,
                         body: AsyncIterator[bytes], grading: bool = False) -> FileInfo:
        ops = await self._ops(sb_id, grading)
        parent = posixpath.dirname(posixpath.normpath("/" + path))
        if parent != "/":  # like `install -D`: missing parent directories are created
            try:
                await asyncio.to_thread(ops.mkdir, parent, True)
            except Forbidden as exc:  # name the file asked for, not only its directory
                raise Forbidden(f"{path}: {exc.message}") from exc
        f = await asyncio.to_thread(ops.open_write, path, mode & 0o777)
        tap = FileWriteTap(path, mode & 0o777)
        try:
            async for chunk in body:
                if chunk:
                    await asyncio.to_thread(f.write, tap.feed(chunk))
        finally:
            await asyncio.to_thread(f.close)
        info = await asyncio.to_thread(ops.stat, path)
        if not self._protected(sb_id, path):  # a viewer reads the trajectory
            self.node.trajectory.record_write(sb_id, tap, info)
        return info

    def _protected(self, sb_id: str, path: str) -> bool:
        """Whether ``path`` names a protected path (what only the grader writes): its
        bytes stay out of the trajectory log, which every token of the project reads."""
        protected = self.node.protected_paths(sb_id)
        where = posixpath.normpath("/" + path.lstrip("/"))  # normpath keeps a leading "//"
        return bool(protected) and covering(protected, where) is not None

    async def file_stat(self, sb_id: str, path: str, grading: bool = False) -> FileInfo:
        return await asyncio.to_thread((await self._ops(sb_id, grading)).stat, path)

    async def file_list(self, sb_id: str, path: str, grading: bool = False) -> list[FileInfo]:
        return await asyncio.to_thread((await self._ops(sb_id, grading)).list, path)

    async def file_mkdir(self, sb_id: str, path: str, parents: bool,
                         grading: bool = False) -> FileInfo:
        ops = await self._ops(sb_id, grading)
        await asyncio.to_thread(ops.mkdir, path, parents)
        return await asyncio.to_thread(ops.stat, path)

    async def file_remove(self, sb_id: str, path: str, recursive: bool,
                          grading: bool = False) -> None:
        await asyncio.to_thread((await self._ops(sb_id, grading)).remove, path, recursive)

    async def tar_read(self, sb_id: str, path: str,
                       grading: bool = False) -> AsyncIterator[bytes]:
        gen = await asyncio.to_thread((await self._ops(sb_id, grading)).tar_out, path)
        return _pull(gen)

    async def tar_write(self, sb_id: str, path: str, body: AsyncIterator[bytes],
                        grading: bool = False) -> int:
        ops = await self._ops(sb_id, grading)
        reader = _QueueReader(asyncio.get_running_loop(), body)
        return await asyncio.to_thread(ops.tar_in, path, reader, MAX_TAR_BYTES)

    # ---- snapshots, display, network, logs ----
    async def pack_diff(self, sb_id: str, req: PackDiffRequest) -> ImageSummary:
        return await self.node.pack_diff(sb_id, req)

    async def screenshot(self, sb_id: str) -> bytes:
        return await self.node.screenshot(sb_id)

    async def input(self, sb_id: str, req: InputRequest) -> None:
        await self.node.input(sb_id, req)

    async def network(self, sb_id: str) -> NetworkStatus:
        return await network_status(self.node, sb_id)

    async def set_network(self, sb_id: str, allow: dict[str, bool]) -> NetworkStatus:
        return await set_network(self.node, sb_id, allow)

    def _scoped_log(self, sb_id: str) -> None:
        # The log outlives a sandbox and does not know its project: a token scoped to a
        # project reads the logs of its live sandboxes only, the root token every log.
        if caller_scope.get() is not None:
            self.node.record(sb_id)

    async def audit(self, sb_id: str) -> list[AuditRecord]:
        self._scoped_log(sb_id)
        return await audit_records(self.node, sb_id)

    async def trajectory(self, sb_id: str, offset: int, limit: int) -> TrajectoryPage:
        self._scoped_log(sb_id)
        log = self.node.trajectory.log
        return TrajectoryPage(entries=log.entries(sb_id, offset, limit), total=log.count(sb_id))

    # ---- jobs ----
    async def jobs(self) -> list[JobInfo]:
        return list(joblib.job_infos(self.node).values())

    async def job_pause(self, job: str) -> None:
        await joblib.pause_job(self.node, job)

    async def job_resume(self, job: str) -> None:
        await joblib.resume_job(self.node, job)

    async def job_stop(self, job: str) -> None:
        await joblib.stop_job(self.node, job)

    async def job_heartbeat(self, job: str, lease_s: float,
                            stop_after_s: float | None) -> None:
        joblib.heartbeat(self.node, job, time.time(), lease_s, stop_after_s)

    # ---- stateless calls and images ----
    async def fncall(self, req: FnCallRequest) -> FnCallResult:
        return await self.node.fncall(req)

    async def fncall_many(self, calls: list[FnCallRequest]) -> list[FnCallResult]:
        return await self.node.fncall_many(calls)

    async def list_images(self) -> list[ImageSummary]:
        return await self.node.list_images()

    async def remove_image(self, name: str) -> None:
        await self.node.remove_image(name)


class LocalCluster:
    """One node, in process: every request goes to it."""

    def __init__(self, node: NodeService) -> None:
        self.node = node
        self.client = LocalNodeClient(node)

    @classmethod
    async def open(cls, config: NodeConfig) -> LocalCluster:
        return cls(await NodeService.open(config))

    def clients(self) -> list[LocalNodeClient]:
        return [self.client]

    def client_for(self, sb_id: str) -> LocalNodeClient:
        if node_short_of(sb_id) != self.client.short:
            raise NotFound(f"sandbox {shorten(sb_id)} not found")
        return self.client

    def image_store(self):
        """The layer store of this node, for the blob routes (None without one)."""
        return getattr(self.node.backends.get("container"), "images", None)

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        await self.node.close()
