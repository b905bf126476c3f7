"""The node agent: owns this host's sandboxes, their durable records and their lifetimes.

Nothing here knows whether it runs in the embedded server or as a Ray actor: the cluster
layer calls these coroutines. A sandbox outlives this process; on start the node finds its
sandboxes again from SQLite and checks each one is really alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from dsec.api import limits
from dsec.api.errors import (Capacity, Conflict, DSecError, Forbidden, InvalidArgument,
                             NotFound, SandboxStopped, Unsupported, shorten)
from dsec.api.fncall import FnCallRequest, FnCallResult
from dsec.api.process import ProcessInfo, ProcessRequest
from dsec.api.scope import caller_scope, visible
from dsec.api.models import (ExecEvent, ExecRequest, ExecResult, ImageSummary, InputRequest,
                             NodeInfo, PackDiffRequest, SandboxInfo, SandboxSpec, ShellInfo,
                             ShellRunRequest, retry_mismatch)
from dsec.node import metrics
from dsec.node.agent.client import AgentGone, AgentProcess, SpawnRequest
from dsec.node.backends.base import Backend, SandboxRecord
from dsec.node.config import NodeConfig
from dsec.node.density.node import NodeDensity
from dsec.node.ended import EndedSandboxes
from dsec.node.pool import WarmPool
from dsec.node.processes import Processes
from dsec.node.records import Records
from dsec.node.shells import ShellSession
from dsec.node.store import NodeStore
from dsec.placement.admission import NodeLoad, admit, fitting
from dsec.node.host.netpolicy import NetworkManager
from dsec.node.network import keep_network_audit
from dsec.node.protection import check_protection
from dsec.node.jobs import reap_leases
from dsec.trajectory.recorder import Recorder, recorded, recorded_stream
from dsec.wal import Checkpointer, checkpoint_forever

__all__ = ["NodeService"]

log = logging.getLogger("dsec.node")
LIVE = ("starting", "running", "paused")


class NodeService:
    """One per host. Create with :meth:`open`, end with :meth:`close`."""

    def __init__(self, config: NodeConfig, backends: dict[str, Backend], store: NodeStore,
                 node_id: str) -> None:
        self.config = config
        self.backends = backends
        self.store = store
        self.trajectory = Recorder(config.state_dir / "trajectory.db")
        self.node_id = node_id
        self.short = node_id.removeprefix("node-")
        self.network = NetworkManager(config.state_dir, self.short)
        self.network.files_of = lambda rec: self.backends[rec.spec.backend].files(rec)
        self.records = Records()
        self._gauges_at = 0.0
        self.shells: dict[str, ShellSession] = {}
        self.processes = Processes()
        self._follow_again: set[str] = set()  # recovered paused: processes not followed yet
        self.ended = EndedSandboxes()  # what expired lately answers "expired", not "not found"
        self._reaper: asyncio.Task | None = None
        self._checkpoints: asyncio.Task | None = None  # both files' WALs, off the loop
        self.pool = WarmPool(config.warm_pool)
        self._filler: asyncio.Task | None = None
        self._creating = 0
        self._requests: dict[str, asyncio.Future] = {}  # request_id -> its create, starting
        self._by_request: dict[str, str] | None = None   # request_id -> sandbox id, lazily
        self._fncalls = self._fncall_mb = 0
        self._start_sem = asyncio.Semaphore(config.start_concurrency)
        self._stop_sem = asyncio.Semaphore(config.start_concurrency * 2)
        self.density = NodeDensity(config.density, self._persist)
        self._in_flight: Counter[str] = Counter()  # execs still running, per sandbox
        self.density.idle.in_flight = self._in_flight.__contains__

    @classmethod
    async def open(cls, config: NodeConfig,
                   backends: dict[str, Backend] | None = None) -> NodeService:
        """Open the node on ``config.state_dir``; ``backends``, when given, are used
        instead of building those ``config.backends`` names (tests, benchmarks)."""
        from dsec.node.backends.registry import make_backends
        limits.configure(config.limits)  # the wire models of this process check these
        store = NodeStore(config.state_dir / "node.db")
        (config.state_dir / "sandboxes").mkdir(mode=0o700, exist_ok=True)  # specs, sockets
        node_id = store.meta("node_id")
        if node_id is None:
            node_id = f"node-{secrets.token_hex(4)}"
            store.set_meta("node_id", node_id)
        if backends is None:
            backends = await asyncio.to_thread(make_backends, config)
        node = cls(config, backends, store, node_id)
        await node.density.open(backends)
        await node._recover()
        await node.network.recover(node.records.values())
        node._reaper = asyncio.create_task(node._reap_forever())
        node._checkpoints = asyncio.create_task(checkpoint_forever(
            Checkpointer(config.state_dir / "node.db"),
            Checkpointer(config.state_dir / "trajectory.db")))
        node.density.start_idle(node.records.values, node.backends)
        node.trajectory.start_pruning(config.trajectory, node.records.__contains__)
        if node.pool.targets:
            node._filler = asyncio.create_task(
                node.pool.fill_forever(node._start_pooled, lambda: node._creating > 0))
        return node

    async def close(self, stop_sandboxes: bool = False) -> None:
        if self._reaper:
            self._reaper.cancel()
        if self._filler:
            self._filler.cancel()
        if self._checkpoints:
            self._checkpoints.cancel()
            await asyncio.gather(self._checkpoints, return_exceptions=True)
        for rec in self.pool.drain():  # pooled sandboxes hold no user state
            await self.backends[rec.spec.backend].stop(rec)
            self.store.delete(rec.id)
        for sh in list(self.shells.values()):
            sh.close()
        self.shells.clear()
        self.processes.close()
        if stop_sandboxes:
            await asyncio.gather(*(self.stop(i) for i in list(self.records)),
                                 return_exceptions=True)
        await self.density.close(sandboxes_left=bool(self.records))
        for backend in self.backends.values():  # node-wide resources (fncall pools)
            await backend.close()
        stores = {id(b.images): b.images for b in self.backends.values() if b.images is not None}
        if not self.records:
            # Layer mounts serve running sandboxes only; a node that leaves none running
            # leaves no mount (nor lazy-loading daemon) behind. The next start remounts.
            # (A guests-only node mounts them too: the busybox image is made from one.)
            for images in stores.values():
                await asyncio.to_thread(images.unmount_all)
        self.store.close()
        self.trajectory.close()
        await self.network.close()

    # ---- recovery and expiry ----
    async def _recover(self) -> None:
        for rec in self.store.all():
            backend = self.backends.get(rec.spec.backend)
            ok = rec.state in ("running", "paused") and backend is not None \
                and await backend.alive(rec)
            if ok:
                self.records[rec.id] = rec
                if rec.spec.backend != "fncall":  # its background processes ran on
                    self._follow_again.add(rec.id)
                    if rec.state == "running":
                        self._follow_kept(rec)
                continue
            if rec.state == "pooled" and backend is not None and await backend.alive(rec):
                self.pool.add(rec)
                continue
            log.info("sandbox %s did not survive (state %s); cleaning up", rec.id, rec.state)
            if backend is not None:
                await backend.stop(rec)
            self.store.delete(rec.id)
        await self._sweep_orphans()

    def _follow_kept(self, rec: SandboxRecord) -> None:
        """Follow again the background processes a sandbox ran through a restart (a paused
        one's agent answers once it is resumed)."""
        self._follow_again.discard(rec.id)
        self.processes.recover(self.backends[rec.spec.backend], rec)

    async def _sweep_orphans(self) -> None:
        """Directories of sandboxes no record knows (a crash mid-create) are removed."""
        root = self.config.state_dir / "sandboxes"
        if not root.is_dir():
            return
        pooled = {r.id for m in self.pool.members.values() for r in m}
        for d in root.iterdir():
            if d.name not in self.records and d.name not in pooled:
                spec = SandboxSpec(backend=_backend_of_dir(d, self.backends))
                rec = SandboxRecord(id=d.name, spec=spec, state="failed", created_at=0,
                                    last_active_at=0)
                await self.backends[spec.backend].stop(rec)

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.reap_interval_s)
            try:
                await self.reap(time.time())
            except Exception:  # the reaper must outlive any one bad sandbox
                log.exception("reaper pass failed")

    async def reap(self, now: float) -> None:
        await reap_leases(self, now)
        for rec in list(self.records.values()):
            if rec.state == "starting":  # its creator's until create returns (or fails)
                continue
            # Why it ends is known before the stop begins, so a request that arrives
            # while it stops hears "expired", as one that comes after it.
            if rec.expires_at is not None and now >= rec.expires_at:
                self.ended.remember(rec.id, "expired (its timeout ran out)",
                                    project=rec.spec.project)
                await self.stop(rec.id)
            elif rec.spec.idle_ttl_s and self._idle_for(rec, now) >= rec.spec.idle_ttl_s:
                if rec.spec.on_idle == "pause":
                    if rec.state == "running":
                        await self.pause(rec.id)
                else:
                    self.ended.remember(rec.id, f"expired (idle for {rec.spec.idle_ttl_s:g}s, "
                                                "its idle_ttl_s)", project=rec.spec.project)
                    await self.stop(rec.id)

    def _idle_for(self, rec: SandboxRecord, now: float) -> float:
        """How long the sandbox has had nothing to do: 0 while an exec of it still runs
        (the notion idle reclaim uses; the exec's end counts as activity too)."""
        return 0.0 if rec.id in self._in_flight else now - rec.last_active_at

    # ---- lookup ----
    def _persist(self, rec: SandboxRecord) -> None:
        if rec.id in self.records:  # a stopped sandbox's record is gone for good
            self.store.put(rec)

    def _get(self, sb_id: str) -> SandboxRecord:
        rec = self.records.get(sb_id)
        if rec is None or not visible(rec.spec.project):  # another project's: no hint
            raise (self.ended.error(sb_id) if rec is None else None) \
                or NotFound(f"sandbox {shorten(sb_id)} not found")
        return rec

    def _not_live(self, rec: SandboxRecord) -> SandboxStopped:
        """The error for a sandbox that is stopping: why it ends, when the node knows."""
        return self.ended.error(rec.id) or SandboxStopped(f"sandbox {rec.id} is {rec.state}")

    def info(self, rec: SandboxRecord) -> SandboxInfo:
        s = rec.spec
        return SandboxInfo(id=rec.id, node=self.node_id, backend=s.backend, image=s.image,
                           layers=s.layers, state=rec.state, cpu=s.cpu, memory_mb=s.memory_mb,
                           disk_mb=s.disk_mb, job=s.job, labels=s.labels,
                           request_id=s.request_id, protected_paths=s.protected_paths,
                           project=s.project or "",
                           created_at=rec.created_at, expires_at=rec.expires_at,
                           last_active_at=rec.last_active_at, error=rec.error,
                           cpu_class=s.cpu_class, **self.density.reclaim_info(rec))

    async def get(self, sb_id: str) -> SandboxInfo:
        rec = self._get(sb_id)
        backend = self.backends[rec.spec.backend]
        try:
            used = backend.memory_bytes(rec) if backend.memory_read_is_cheap \
                else await asyncio.to_thread(backend.memory_bytes, rec)
        except Unsupported:
            return self.info(rec)
        return self.info(rec).model_copy(update={"memory_used_mb": round(used / (1 << 20), 1)})

    async def list(self, job: str | None = None, labels: dict[str, str] | None = None,
                   request_id: str | None = None) -> list[SandboxInfo]:
        """Sandboxes of this node; ``request_id`` matches a create's key and the keys
        ``<request_id>#<i>`` of a batch's items."""
        out = []
        for rec in self.records.values():
            if not visible(rec.spec.project):
                continue
            if job is not None and rec.spec.job != job:
                continue
            if request_id is not None and not _same_request(rec.spec.request_id, request_id):
                continue
            if labels and any(rec.spec.labels.get(k) != v for k, v in labels.items()):
                continue
            out.append(self.info(rec))
        return out

    def load(self) -> NodeLoad:
        """What this node holds now; fncalls in flight count as what they reserve. Also
        refreshes the node's sandbox gauge (the watcher asks every second)."""
        recs = self.records
        if (now := time.monotonic()) - self._gauges_at >= 1.0:  # O(sandboxes): once a second
            self._gauges_at = now
            states = dict.fromkeys(("running", "paused", "starting"), 0)
            for r in recs.values():
                states[r.state] = states.get(r.state, 0) + 1
            for state, n in states.items():
                metrics.SANDBOXES.labels(state).set(n)
        host = self.density.host()  # sampled at most a few times a second
        return NodeLoad(node_id=self.node_id, backends=tuple(self.backends),
                        cpus=_CPUS, memory_mb=_HOST_MEMORY_MB, sandboxes=len(recs),
                        memory_reserved_mb=recs.memory_mb + self._fncall_mb,
                        cpu_reserved=recs.cpu + 0.05 * self._fncalls,
                        memory_available_mb=host.memory_available_mb,
                        swap_free_mb=host.swap_free_mb if host.swap_gain_mb is None
                        else host.swap_gain_mb, cpu_used=host.cpu_used,
                        memory_pressure=host.memory_pressure, cpu_pressure=host.cpu_pressure,
                        sandbox_cpu_used=host.sandbox_cpu_used)

    async def node_info(self) -> NodeInfo:
        load = self.load()
        host = self.density.host()
        reclaimed = sum(NodeDensity.reclaim_info(r).get("memory_reclaimed_mb", 0.0)
                        for r in self.records.values())
        return NodeInfo(id=self.node_id, backends=list(load.backends), cpus=load.cpus,
                        memory_mb=load.memory_mb, sandboxes=load.sandboxes,
                        running=sum(r.state == "running" for r in self.records.values()),
                        memory_reserved_mb=load.memory_reserved_mb,
                        cpu_reserved=round(load.cpu_reserved, 2),
                        memory_available_mb=host.memory_available_mb,
                        memory_reclaimed_mb=round(reclaimed, 1), swap_mb=host.swap_total_mb,
                        swap_free_mb=host.swap_free_mb, cpu_used=load.cpu_used,
                        memory_pressure=host.memory_some, cpu_pressure=host.cpu_pressure,
                        core_scheduling=self.density.core.note,
                        ksm=self.density.ksm_note())

    # ---- lifecycle ----
    def _new_record(self, spec: SandboxSpec) -> SandboxRecord:
        if spec.backend not in self.backends:
            raise Unsupported(f"backend {spec.backend!r} is not available on {self.node_id}; "
                              f"available: {sorted(self.backends)}")
        if spec.cpu_class not in self.backends[spec.backend].cpu_classes:
            raise Unsupported(f"{spec.backend} sandboxes offer cpu_class "
                              f"{sorted(self.backends[spec.backend].cpu_classes)}; got "
                              f"{spec.cpu_class!r}")
        if spec.network != "none":
            self.network.check(spec.network)
        if spec.protected_paths:
            check_protection(self.backends[spec.backend], spec.backend)
        now = time.time()
        return SandboxRecord(id=f"sb-{self.short}-{secrets.token_hex(6)}", spec=spec,
                             state="starting", created_at=now, last_active_at=now,
                             expires_at=now + spec.ttl_s if spec.ttl_s else None)

    def _check_spec(self, spec: SandboxSpec) -> None:
        """Bounds this node sets beyond the wire model's."""
        top = self.config.max_disk_mb
        if spec.disk_mb > top:
            raise InvalidArgument(
                f"disk_mb must be at most {top} on node {self.node_id} (NodeConfig.max_disk_mb: "
                f"a container's writable layer is held in memory); got {spec.disk_mb}")

    def _bounded(self, req):
        """``req`` with max_output lowered to what this node keeps for a result."""
        top = self.config.max_exec_output
        return req if req.max_output <= top else req.model_copy(update={"max_output": top})

    async def create(self, spec: SandboxSpec) -> SandboxInfo:
        """Start a sandbox; a ``request_id`` seen before returns that create's sandbox
        (waiting for it if that create is still starting) instead of making another."""
        spec = _owned(spec)
        if spec.request_id is None:
            return await self._create(spec)
        key = _request_key(spec)  # keys are per project: another's cannot collide
        if (rec := self._existing(key)) is not None:
            if why := retry_mismatch(spec, rec.spec):
                raise Conflict(why)
            return self.info(rec)
        pending = self._requests.get(key)
        if pending is not None:
            info = await asyncio.shield(pending)
            if why := retry_mismatch(spec, info):
                raise Conflict(why)
            return info
        task = asyncio.ensure_future(self._create(spec))
        task.add_done_callback(lambda t: self._remember(key, t))
        self._requests[key] = task
        try:
            return await asyncio.shield(task)
        finally:
            if task.done():
                self._requests.pop(key, None)
            else:
                task.add_done_callback(lambda _: self._requests.pop(key, None))

    def _existing(self, key: str) -> SandboxRecord | None:
        if self._by_request is None:  # first use since the node opened: index what it found
            self._by_request = {_request_key(r.spec): r.id for r in self.records.values()
                                if r.spec.request_id}
        sb_id = self._by_request.get(key)
        return self.records.get(sb_id) if sb_id else None

    def _remember(self, key: str, task: asyncio.Future) -> None:
        if not task.cancelled() and task.exception() is None:
            self._existing(key)  # builds the index if needed
            self._by_request[key] = task.result().id

    async def _create(self, spec: SandboxSpec) -> SandboxInfo:
        self._check_spec(spec)
        reason = admit(self.load(), spec.backend, spec.memory_mb, spec.cpu,
                       self.config.admission)
        if reason:
            raise Capacity(reason)
        t0 = time.perf_counter()
        pooled = self.pool.take(spec)
        if pooled is not None:
            try:
                self._check_images([spec.image, *spec.layers])
            except NotFound:
                self.pool.add(pooled)  # untouched: the next create may take it
                raise
            return await self._adopt(pooled, spec, t0)
        rec = self._new_record(spec)
        self.records[rec.id] = rec
        self._creating += 1
        try:
            async with self._start_sem:
                rec.runtime = await self.backends[spec.backend].start(rec)
                await self.network.attach(rec, self.records.values())
            rec.state = "running"
            self.store.put(rec)  # inside: a sandbox not recorded is not left running
        except BaseException as exc:
            self.records.pop(rec.id, None)
            if rec.runtime:  # started, then its network (or its record) failed
                await self.backends[spec.backend].stop(rec)
                self.store.delete(rec.id)
            metrics.CREATE_FAILURES.labels(spec.backend).inc()
            if isinstance(exc, DSecError):
                raise
            raise Capacity(f"could not start sandbox: {exc}") from exc
        finally:
            self._creating -= 1
        metrics.CREATIONS.labels(spec.backend).inc()
        metrics.CREATE_SECONDS.labels(spec.backend).observe(time.perf_counter() - t0)
        return self.info(rec)

    async def _start_pooled(self, image: str) -> SandboxRecord:
        rec = self._new_record(SandboxSpec(image=image, ttl_s=None))
        rec.state = "pooled"
        async with self._start_sem:
            rec.runtime = await self.backends["container"].start(rec)
        self.store.put(rec)
        return rec

    async def _adopt(self, rec: SandboxRecord, spec: SandboxSpec, t0: float) -> SandboxInfo:
        """Turn a pooled sandbox into the caller's: its limits, times and spec."""
        backend = self.backends[spec.backend]
        if spec.protected_paths:  # what start checks for a sandbox made for this create
            try:
                check_protection(backend, spec.backend)
                await backend.refuse_stray_links(rec, spec.protected_paths)
            except BaseException:
                self.pool.add(rec)  # still untouched: the next create may take it
                raise
        now = time.time()
        rec.spec, rec.created_at, rec.last_active_at = spec, now, now
        rec.expires_at = now + spec.ttl_s if spec.ttl_s else None
        self.records[rec.id] = rec
        try:
            await backend.apply_spec(rec)
            await self.network.attach(rec, self.records.values())
        except BaseException:
            self.records.pop(rec.id, None)
            await backend.stop(rec)
            self.store.delete(rec.id)
            raise
        rec.state = "running"
        self.store.put(rec)
        metrics.CREATIONS.labels(spec.backend).inc()
        metrics.CREATE_SECONDS.labels(spec.backend).observe(time.perf_counter() - t0)
        return self.info(rec)

    async def create_many(self, count: int, spec: SandboxSpec, request_id: str | None = None,
                          first_index: int = 0) -> tuple[list[SandboxInfo], list[str]]:
        """``count`` sandboxes at once. As many as admission lets in are made; each of the
        rest gets its own error. With ``request_id`` item ``i`` is keyed
        ``<request_id>#<first_index + i>``, so a retried batch makes only what is missing."""
        spec = _owned(spec)
        self._check_spec(spec)
        fit = fitting(self.load(), spec.backend, spec.memory_mb, spec.cpu,
                      self.config.admission, count)
        if fit == 0:
            raise Capacity(admit(self.load(), spec.backend, spec.memory_mb, spec.cpu,
                                 self.config.admission) or "node is full")
        specs = [spec if request_id is None else
                 spec.model_copy(update={"request_id": f"{request_id}#{first_index + i}"})
                 for i in range(count)]
        results = await asyncio.gather(*(self.create(s) for s in specs[:fit]),
                                       return_exceptions=True)
        made = [r for r in results if isinstance(r, SandboxInfo)]
        errors = [f"item {first_index + i}: {r}" for i, r in enumerate(results)
                  if not isinstance(r, SandboxInfo)]
        if fit < count:
            why = admit(self.load(), spec.backend, spec.memory_mb, spec.cpu,
                        self.config.admission) or "node is full"
            errors += [f"item {first_index + i}: capacity: {why}" for i in range(fit, count)]
        return made, errors

    async def stop(self, sb_id: str) -> None:
        if sb_id not in self.records and sb_id in self.ended:
            return  # it expired and was stopped already: stopping it again is done
        rec = self._get(sb_id)
        rec.state = "stopped"
        self.processes.drop(sb_id)
        for sh_id in [k for k, s in self.shells.items() if s.sandbox_id == sb_id]:
            self.shells.pop(sh_id).close()
        await keep_network_audit(self, rec)
        await self.density.stopping(rec)
        try:
            async with self._stop_sem:  # a mass stop must not starve the server's threads
                await self.backends[rec.spec.backend].stop(rec)
        finally:
            self.records.pop(sb_id, None)
            self.store.delete(sb_id)
            self.trajectory.ended(sb_id)

    async def set_timeout(self, sb_id: str, timeout_s: float) -> SandboxInfo:
        """The sandbox now stops ``timeout_s`` seconds from now (longer or shorter)."""
        rec = self._get(sb_id)
        if rec.state not in LIVE:
            raise self._not_live(rec)
        rec.expires_at = time.time() + timeout_s
        self.store.put(rec)
        return self.info(rec)

    async def pause(self, sb_id: str) -> SandboxInfo:
        rec = self._get(sb_id)
        if rec.state == "running":
            backend = self.backends[rec.spec.backend]
            await backend.pause(rec)
            rec.state = "paused"
            self.store.put(rec)
            self.density.paused(rec, backend)  # reclaims in the background
        return self.info(rec)

    async def resume(self, sb_id: str) -> SandboxInfo:
        rec = self._get(sb_id)
        if rec.state == "paused":
            backend = self.backends[rec.spec.backend]
            await self.density.resuming(rec, backend)
            await backend.resume(rec)
            rec.state = "running"
            self.store.put(rec)
            if rec.id in self._follow_again:
                self._follow_kept(rec)
        return self.info(rec)

    async def _active(self, sb_id: str) -> tuple[Backend, SandboxRecord]:
        """The record of a sandbox about to be used: resumed if paused, marked active."""
        rec = self._get(sb_id)
        if rec.state == "paused":
            await self.resume(sb_id)
        if rec.state != "running":
            raise self._not_live(rec)
        rec.last_active_at = time.time()
        return self.backends[rec.spec.backend], rec

    # ---- exec and shells ----
    @recorded("exec", ExecResult)
    async def exec(self, sb_id: str, req: ExecRequest) -> ExecResult:
        backend, rec = await self._active(sb_id)
        req = self._bounded(req)  # after the log saw the request as it was asked
        with metrics.EXEC_SECONDS.labels(rec.spec.backend).time(), self._running(rec):
            return await backend.exec(rec, req)

    @recorded_stream
    async def exec_stream(self, sb_id: str, req: ExecRequest) -> AsyncIterator[ExecEvent]:
        backend, rec = await self._active(sb_id)
        with self._running(rec):
            async for ev in backend.exec_events(rec, req):
                yield ev

    @contextlib.contextmanager
    def _running(self, rec: SandboxRecord) -> Iterator[None]:
        """A request under way: idle reclaim leaves the sandbox alone until it ends, and
        its end counts as activity too (a long exec is not idleness)."""
        self._in_flight[rec.id] += 1
        try:
            yield
        finally:
            self._in_flight[rec.id] -= 1
            if not self._in_flight[rec.id]:
                del self._in_flight[rec.id]
            rec.last_active_at = time.time()

    async def process_start(self, sb_id: str, req: ProcessRequest) -> ProcessInfo:
        """Start a background process, kept and followed by pid (node/processes.py)."""
        backend, rec = await self._active(sb_id)
        if rec.spec.backend == "fncall":
            raise Unsupported(f"sandbox {sb_id} is fncall: a stateless worker runs no "
                              "background processes")
        return await self.processes.start(backend, rec, self._bounded(req))

    async def shell_open(self, sb_id: str) -> ShellInfo:
        backend, rec = await self._active(sb_id)
        spawn = SpawnRequest(argv=["/bin/sh"], env=_shell_env(rec),
                             cwd=rec.runtime.get("image_cwd") or "/",
                             protect=list(rec.spec.protected_paths))
        try:
            proc = await AgentProcess.start(backend.connector(rec), spawn)
        except AgentGone as exc:
            raise SandboxStopped(f"sandbox {sb_id} is not answering: {exc}") from exc
        sh = ShellSession(id=f"sh-{secrets.token_hex(6)}", sandbox_id=sb_id, proc=proc)
        self.shells[sh.id] = sh
        return ShellInfo(id=sh.id, sandbox_id=sb_id)

    def _shell(self, sb_id: str, sh_id: str) -> ShellSession:
        sh = self.shells.get(sh_id)
        if sh is None or sh.sandbox_id != sb_id:
            raise NotFound(f"shell {shorten(sh_id)} not found in sandbox {sb_id}")
        return sh

    @recorded("shell_run", ExecResult)
    async def shell_run(self, sb_id: str, sh_id: str, req: ShellRunRequest) -> ExecResult:
        await self._active(sb_id)
        return await self._shell(sb_id, sh_id).run(self._bounded(req))

    async def shell_close(self, sb_id: str, sh_id: str) -> None:
        self._get(sb_id)  # another project's sandbox (and so its shells) is not found
        self._shell(sb_id, sh_id)
        self.shells.pop(sh_id).close()

    async def pty(self, sb_id: str, cmd: list[str] | None, rows: int, cols: int
                  ) -> AgentProcess:
        """An interactive process on a pseudo-terminal (``dsec shell``)."""
        backend, rec = await self._active(sb_id)
        spawn = SpawnRequest(argv=cmd or ["/bin/sh", "-i"], env=_shell_env(rec),
                             cwd=rec.runtime.get("image_cwd") or "/", pty=True,
                             rows=rows, cols=cols, protect=list(rec.spec.protected_paths))
        try:
            return await AgentProcess.start(backend.connector(rec), spawn)
        except AgentGone as exc:
            raise SandboxStopped(f"sandbox {sb_id} is not answering: {exc}") from exc

    # ---- files ----
    async def files(self, sb_id: str, grading: bool = False):
        """The sandbox's file operations; unless ``grading`` (the caller is the grading
        identity), confined away from its protected paths (:mod:`dsec.node.protected`)."""
        backend, rec = await self._active(sb_id)
        ops = backend.files(rec)
        if rec.spec.protected_paths and not grading:
            ops.protected = tuple(rec.spec.protected_paths)
        elif rec.spec.protected_paths and hasattr(ops, "nolink"):
            ops.nolink = tuple(rec.spec.protected_paths)  # a guest's: its commands' tar -x
        return ops

    def protected_paths(self, sb_id: str) -> list[str]:
        """The sandbox's protected paths (NotFound as :meth:`get`)."""
        return list(self._get(sb_id).spec.protected_paths)

    # ---- images ----
    def _layer_store(self):
        backend = self.backends.get("container")
        return backend.images if backend is not None else None

    def _images(self):
        images = self._layer_store()
        if images is None:
            raise Unsupported(f"node {self.node_id} has no layer store")
        return images

    def _check_images(self, refs: list[str]) -> None:
        """Another project's snapshot is NotFound to a project's token also where an image
        is used by name without being resolved (a pooled sandbox, a warm fncall worker)."""
        images = self._layer_store()
        if images is not None and caller_scope.get() is not None:
            images.check_visible(refs)

    # ---- stateless calls ----
    def _fncall_backend(self):
        backend = self.backends.get("fncall")
        if backend is None:
            raise Unsupported(f"node {self.node_id} has no fncall backend")
        return backend

    async def fncall(self, req: FnCallRequest) -> FnCallResult:
        """One call on a pooled worker; counted in this node's load while it runs."""
        return await self._fncalling([req], lambda b: b.call(req))

    async def fncall_many(self, calls: list[FnCallRequest]) -> list[FnCallResult]:
        return await self._fncalling(calls, lambda b: b.call_many(calls))

    async def _fncalling(self, calls: list[FnCallRequest], run):
        backend = self._fncall_backend()
        self._check_images(sorted({c.image for c in calls}))
        mb = sum(c.memory_mb for c in calls)
        self._fncalls += len(calls)
        self._fncall_mb += mb
        try:
            return await run(backend)
        finally:
            self._fncalls -= len(calls)
            self._fncall_mb -= mb

    async def list_images(self) -> list[ImageSummary]:
        infos = await asyncio.to_thread(self._images().list_images)
        return [ImageSummary(name=i.name, digest=i.manifest_digest, layers=i.layers,
                             size=i.size, created=i.created.timestamp(), project=i.project)
                for i in infos]

    async def remove_image(self, name: str) -> None:
        """Untag ``name`` and delete its manifest and layers unless something else (another
        tag's image, a sandbox of this node) still holds them."""
        held = [*self.records.values(), *(r for m in self.pool.members.values() for r in m)]
        in_use = {d for rec in held for d in rec.runtime.get("layer_digests") or ()}
        await asyncio.to_thread(self._images().remove, name, in_use)

    @recorded("pack_diff", ImageSummary)
    async def pack_diff(self, sb_id: str, req: PackDiffRequest) -> ImageSummary:
        """Pack the writable layer as a new layer over the sandbox's image and tag it."""
        backend, rec = await self._active(sb_id)
        info = await backend.pack_diff(rec, req.tag, ["/.dsec", *req.exclude])
        layers = len(rec.runtime.get("layer_digests") or []) + 1
        return ImageSummary(name=info.tag or req.tag, digest=info.manifest_digest or "",
                            layers=layers, size=info.size, created=time.time(),
                            project=caller_scope.get())  # whose it is: images.claim

    # ---- display and input (vm) ----
    async def screenshot(self, sb_id: str) -> bytes:
        backend, rec = await self._active(sb_id)
        return await backend.screenshot(rec)

    async def input(self, sb_id: str, req: InputRequest) -> None:
        if req.text is None and not req.keys and req.click is None:
            raise InvalidArgument("input needs text, keys or click; got none of them")
        backend, rec = await self._active(sb_id)
        if rec.spec.protected_paths:
            # What a display takes reaches the guest's console shell, which init starts at
            # boot, before any protected path is known: Landlock does not confine it.
            raise Forbidden(
                f"sandbox {sb_id} has protected_paths, and display input would reach its "
                "console shell, which they do not confine; create it without "
                "protected_paths to use the display's input")
        if req.text is not None:
            await backend.type_text(rec, req.text)
        if req.keys:
            await backend.press_keys(rec, req.keys)
        if req.click is not None:
            await backend.click(rec, req.click[0], req.click[1], req.button)

    def record(self, sb_id: str) -> SandboxRecord:
        return self._get(sb_id)


def _shell_env(rec: SandboxRecord) -> dict[str, str]:
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "HOME": "/root", "HOSTNAME": rec.id, "TERM": "xterm"}
    env.update(rec.runtime.get("image_env") or {})
    env.update(rec.spec.env)
    return env


def _backend_of_dir(d: Path, backends: dict[str, Backend]) -> str:
    """The backend that can clean up an orphan directory; runc-based ones by default."""
    marker = d / "backend"
    name = marker.read_text().strip() if marker.exists() else "container"
    if name in backends:
        return name
    if "container" in backends:
        return "container"
    raise InvalidArgument(f"orphan {d.name} belongs to backend {name}, not enabled here")


_CPUS = os.cpu_count() or 1
_HOST_MEMORY_MB = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20)


def _owned(spec: SandboxSpec) -> SandboxSpec:
    """``spec`` with its project: the caller's by default; one outside the caller's scope
    is refused (the gateway checks first; this holds for a node's own API too)."""
    scope = caller_scope.get()
    if spec.project is None:
        return spec if scope is None else spec.model_copy(update={"project": scope})
    if not visible(spec.project):
        raise Forbidden(f"project {spec.project!r} is not {scope!r} or below it; a token "
                        "creates sandboxes in its own project and those under it")
    return spec


def _request_key(spec: SandboxSpec) -> str:
    return f"{spec.project or ''}\0{spec.request_id}"


def _same_request(key: str | None, request_id: str) -> bool:
    """``key`` is ``request_id`` itself or one item of the batch it names."""
    return key is not None and (key == request_id or key.startswith(request_id + "#"))
