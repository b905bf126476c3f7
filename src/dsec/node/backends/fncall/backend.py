"""The fncall backend: stateless calls on pooled, pre-warmed, isolated workers.

Design (see also ``worker.py``, ``server.py`` and ``pool.py``):

- **Isolation.** A worker is a container sandbox made by the container backend's machinery:
  runc namespaces (pid, mount, ipc, uts, and a network namespace with only loopback, so no
  network), cgroup limits on memory and processes, Docker's seccomp profile, dropped
  capabilities, no_new_privs. Inside, each call runs as the worker's own unprivileged uid in
  a fresh fork with rlimits on CPU time, file size, open files and processes, in a scratch
  directory on the worker's tmpfs-backed writable layer (sized by ``disk_mb``).
- **Statelessness.** Python code and callables run in a fork of a warm interpreter that
  has already imported common modules (and cloudpickle), so a call pays no interpreter
  start and no import cost, and its changes to globals, modules, environment or cwd die
  with the fork. After each call every process of the call's uid is killed, the scratch
  directory and anything new in /tmp, /var/tmp, /dev/shm, /dev/mqueue are deleted, and the
  node compares the worker's writable layer with its snapshot: a worker whose call crashed,
  hung, ran out of memory or left anything behind is replaced, not reused.
- **Pools.** One pool per (image, memory_mb, disk_mb); at most ``max_workers`` workers each,
  ``warm`` kept ready once a pool has been used. Pools start lazily on their first call (or
  when a fncall sandbox is created), so enabling this backend costs the node's start nothing.
- **Sandboxes.** ``create(backend="fncall")`` gives a handle with no state: its ``exec`` runs
  each command as a call in a clean worker (``/bin/sh``), so nothing carries over between two
  commands. Shells, files, pause and pack_diff answer Unsupported.
- **Callables** travel as cloudpickle of (function, args, kwargs); the value comes back
  pickled and is only unpickled by the caller. The node never unpickles anything. The
  worker's Python must be the caller's minor version for functions to load.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shlex
import time
from pathlib import Path

from dsec.api.errors import InvalidArgument, Unsupported
from dsec.api.fncall import FnCallRequest, FnCallResult
from dsec.api.models import ExecEvent, ExecRequest, ExecResult
from dsec.node.agent.client import AgentConnector
from dsec.node.backends.base import Backend, SandboxRecord
from dsec.node.backends.fncall.pool import Pool
from dsec.node.backends.fncall.worker import Worker, WorkerContainers, WorkerKey
from dsec.node.files import FileOps

__all__ = ["FncallBackend"]

# Call uids: one per worker, far above any image's users. Random, because RLIMIT_NPROC is
# counted per uid across the whole host: two nodes on one host must not share one.
UID_BASE, UID_RANGE = 200_000, 1_000_000


class _Refused(Exception):
    pass


class FncallBackend(Backend):
    """See the module docstring."""

    name = "fncall"
    memory_read_is_cheap = True  # nothing to read

    def __init__(self, state_dir: Path, images, agent_binary: Path,
                 max_workers: int | None = None, warm: int = 2,
                 preload: tuple[str, ...] = (), idle_s: float = 300.0) -> None:
        self.images = images
        self.containers = WorkerContainers(state_dir, images, agent_binary)
        self.max_workers = max_workers or max(2, 2 * (os.cpu_count() or 1))
        self.warm = warm
        self.preload = preload
        self.idle_s = idle_s
        self.pools: dict[WorkerKey, Pool] = {}
        self._janitor: asyncio.Task | None = None
        self._closing: set[Pool] = set()

    # ---- calls ----
    def pool(self, key: WorkerKey) -> Pool:
        pool = self.pools.get(key)
        if pool is None:
            pool = Pool(key, lambda: self._start_worker(key), self.max_workers, self.warm)
            self.pools[key] = pool
        if self._janitor is None:
            self._janitor = asyncio.get_running_loop().create_task(self._close_idle_forever())
        return pool

    async def _close_idle_forever(self) -> None:
        """Pools with no call for ``idle_s`` seconds and no call running give back their
        workers' memory; the next call starts the pool again."""
        while True:
            await asyncio.sleep(min(30.0, self.idle_s / 2))
            now = time.monotonic()
            for key, pool in list(self.pools.items()):
                if now - pool.last_used > self.idle_s and pool.size == len(pool.idle):
                    del self.pools[key]
                    self._closing.add(pool)
                    try:
                        await pool.close()
                    finally:
                        self._closing.discard(pool)

    async def _start_worker(self, key: WorkerKey) -> Worker:
        live = {w.uid for p in self.pools.values() for w in p.idle}
        uid = UID_BASE + secrets.randbelow(UID_RANGE)
        while uid in live:
            uid = UID_BASE + secrets.randbelow(UID_RANGE)
        return await Worker.start(self.containers, key, uid, self.preload)

    async def call(self, req: FnCallRequest) -> FnCallResult:
        """Run one call on a clean worker of its pool."""
        pool = self.pool((req.image, req.memory_mb, req.disk_mb))
        worker = await pool.acquire()
        try:
            why = worker.supports(req)
            if why is not None:  # the backend could, this image cannot: change the request
                raise _Refused(why)
            return await worker.call(req)
        except _Refused as exc:  # the worker never saw the call: it stays healthy
            raise InvalidArgument(str(exc)) from None
        except BaseException:
            worker.healthy = False
            raise
        finally:
            await pool.release(worker)
            pool.fill()

    async def call_many(self, reqs: list[FnCallRequest]) -> list[FnCallResult]:
        """Run calls concurrently (bounded by the pools' sizes); results in request order."""
        return list(await asyncio.gather(*(self.call(r) for r in reqs)))

    async def close(self) -> None:
        if self._janitor is not None:
            self._janitor.cancel()
        # a pool the janitor was closing when cancelled is finished here (close is idempotent)
        pools, self.pools = [*self.pools.values(), *self._closing], {}
        await asyncio.gather(*(p.close() for p in pools), return_exceptions=True)
        await self.containers.close()  # its sandboxes dir's own mount, its subreaper hold

    # ---- the Backend contract, for stateless sandboxes ----
    async def start(self, rec: SandboxRecord) -> dict:
        await asyncio.to_thread(self.images.resolve, rec.spec.image, rec.spec.layers)
        if rec.spec.layers:
            raise InvalidArgument("fncall sandboxes take an image only, no extra layers")
        self.pool(self._key(rec)).fill()
        return {"stateless": True}

    @staticmethod
    def _key(rec: SandboxRecord) -> WorkerKey:
        return (rec.spec.image, rec.spec.memory_mb, rec.spec.disk_mb)

    async def exec(self, rec: SandboxRecord, req: ExecRequest) -> ExecResult:
        """One command in a clean worker; nothing survives it."""
        if req.background:
            raise Unsupported("fncall sandboxes keep no processes: background exec is "
                              "unsupported; use a container sandbox")
        if req.cwd or req.user:
            raise Unsupported("fncall commands run in a fresh scratch directory as the "
                              "worker's own user; cwd and user cannot be chosen")
        import base64
        code = req.cmd if isinstance(req.cmd, str) else shlex.join(req.cmd)
        call = FnCallRequest(language="sh", code=code, image=rec.spec.image,
                             env={**rec.spec.env, **req.env},
                             stdin=base64.b64decode(req.stdin) if req.stdin else None,
                             timeout=req.timeout or 3600, memory_mb=rec.spec.memory_mb,
                             disk_mb=rec.spec.disk_mb, pids=min(rec.spec.pids, 4096),
                             max_output=req.max_output)
        out = await self.call(call)
        return ExecResult(exit_code=out.exit_code, stdout=out.stdout, stderr=out.stderr,
                          stdout_truncated=out.stdout_truncated,
                          stderr_truncated=out.stderr_truncated, duration_ms=out.duration_ms,
                          timed_out=out.timed_out, oom_killed=out.oom_killed)

    async def exec_events(self, rec: SandboxRecord, req: ExecRequest):
        """Streaming for a stateless call: the whole output, then the exit."""
        result = await self.exec(rec, req)
        for kind in ("stdout", "stderr"):
            if getattr(result, kind):
                yield ExecEvent(type=kind, data=getattr(result, kind))
        yield ExecEvent(type="exit", result=result)

    async def stop(self, rec: SandboxRecord) -> None:
        """A stateless sandbox owns nothing to stop."""

    async def pause(self, rec: SandboxRecord) -> None:
        raise Unsupported("fncall sandboxes hold no processes to pause")

    async def resume(self, rec: SandboxRecord) -> None:
        raise Unsupported("fncall sandboxes hold no processes to resume")

    async def alive(self, rec: SandboxRecord) -> bool:
        return True

    def connector(self, rec: SandboxRecord) -> AgentConnector:
        raise Unsupported("fncall sandboxes are stateless: no shells or agent connections; "
                          "use a container sandbox")

    def files(self, rec: SandboxRecord) -> FileOps:
        raise Unsupported("fncall sandboxes are stateless: no files persist; pass input "
                          "files with client.fncall(files=...) or use a container sandbox")

    def oom_kills(self, rec: SandboxRecord) -> int:
        return 0

    def memory_bytes(self, rec: SandboxRecord) -> int:
        return 0
