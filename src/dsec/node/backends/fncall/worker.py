"""One warm worker: a container sandbox running the fncall server, serving one call at a time.

The container comes from the container backend's own machinery (runc, overlayfs over the
image's shared layers, a tmpfs upper layer of ``disk_mb``, cgroup limits, seccomp, dropped
capabilities, a network namespace holding only loopback), so a worker is isolated exactly
like a container sandbox. Its extra read-only binds are the server program and the node's
cloudpickle. The server is started through the in-sandbox agent and spoken to over the
agent's stdin/stdout relay: one JSON line per request and per reply (see ``server.py``).

After every call the node checks the worker's writable layer against the snapshot taken
when it became ready: a call that managed to leave a file behind anywhere makes the worker
dirty, and a dirty worker is replaced rather than reused.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
import signal
import time
from pathlib import Path

import cloudpickle

from dsec.api.errors import DSecError, Internal
from dsec.api.fncall import FnCallRequest, FnCallResult, RemoteErrorInfo
from dsec.api.models import SandboxSpec
from dsec.node.agent.client import AgentGone, AgentProcess, SpawnRequest
from dsec.node.backends.base import SandboxRecord
from dsec.node.backends.container import ContainerBackend
from dsec.node.backends.fncall.plan import plan_call
from dsec.node.host import fdtree

__all__ = ["Worker", "WorkerContainers", "WorkerKey", "OVERHEAD_MB"]

SERVER = Path(__file__).with_name("server.py")
OVERHEAD_MB = 64     # the server's own memory, on top of what a call may use
DISK_SLACK_MB = 8    # the scratch directory's bookkeeping beside the call's files
CONTAINER_PIDS = 1024  # outer bound; each call is held to its own RLIMIT_NPROC
START_TIMEOUT_S = 60.0
REPLY_GRACE_S = 10.0  # past the call's own deadline, before the worker itself is killed

WorkerKey = tuple[str, int, int]  # (image, memory_mb, disk_mb)


class WorkerContainers(ContainerBackend):
    """The container backend plus the server program and cloudpickle bound in read-only."""

    name = "fncall-worker"

    def _config(self, rec: SandboxRecord, d: Path, image_cfg) -> dict:
        cfg = super()._config(rec, d, image_cfg)
        cp = Path(cloudpickle.__file__).parent
        for src, dst in ((SERVER, "/.dsec/fn/server.py"), (cp, "/.dsec/py/cloudpickle")):
            cfg["mounts"].append({"destination": dst, "type": "bind", "source": str(src),
                                  "options": ["rbind", "ro", "nosuid", "nodev"]})
        return cfg


class Worker:
    """A started worker. Use :meth:`start`, then :meth:`call` one at a time, then :meth:`stop`."""

    def __init__(self, containers: WorkerContainers, rec: SandboxRecord, uid: int) -> None:
        self.containers = containers
        self.rec = rec
        self.uid = uid
        self.id = rec.id
        self.proc: AgentProcess | None = None
        self.healthy = True
        self.calls = 0
        self._buf = bytearray()
        self._baseline: set[str] = set()

    @classmethod
    async def start(cls, containers: WorkerContainers, key: WorkerKey, uid: int,
                    preload: tuple[str, ...] = ()) -> Worker:
        image, memory_mb, disk_mb = key
        spec = SandboxSpec(image=image, memory_mb=memory_mb + OVERHEAD_MB,
                           disk_mb=disk_mb + DISK_SLACK_MB, pids=CONTAINER_PIDS, ttl_s=None)
        now = time.time()
        rec = SandboxRecord(id=f"fw-{secrets.token_hex(6)}", spec=spec, state="starting",
                            created_at=now, last_active_at=now)
        # no record is kept: after a crash of the node, its sweep of unknown sandbox
        # directories removes the worker as the container sandbox it is
        w = cls(containers, rec, uid)
        try:
            rec.runtime = await containers.start(rec)
            root = containers.sandbox_dir(rec.id) / "rootfs"
            if not any(os.path.lexists(root / p) for p in ("usr/bin/python3",
                                                           "usr/local/bin/python3")):
                from dsec.node.backends.fncall.shell import ShellWorker
                w = ShellWorker(containers, rec, uid)
            await asyncio.wait_for(w._start_server(preload), START_TIMEOUT_S)
        except BaseException:
            await w.stop()
            raise
        return w

    def supports(self, req: FnCallRequest) -> str | None:
        """Why this worker cannot run ``req``, or None."""
        return None

    async def _start_server(self, preload: tuple[str, ...]) -> None:
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "LANG": "C.UTF-8"}
        argv = ["python3", "-I", "-B", "/.dsec/fn/server.py", str(self.uid), ",".join(preload)]
        self.proc = await AgentProcess.start(self.containers.connector(self.rec),
                                             SpawnRequest(argv=argv, env=env, cwd="/"))
        ready = await self._read_line()
        if not ready.get("ready"):
            raise Internal(f"fncall worker {self.id} did not start: {ready}")
        self.info = ready
        self._baseline = self._upper_paths()

    async def _read_line(self) -> dict:
        assert self.proc is not None
        stderr = bytearray()
        while b"\n" not in self._buf:
            kind, data = await self.proc.next_event()
            if kind == "stdout":
                self._buf += data
            elif kind == "stderr":
                stderr += data[:65536]
            else:
                raise AgentGone(f"fncall server exited ({self.proc.exit_code}, signal "
                                f"{self.proc.signal}): {stderr.decode(errors='replace')}")
        line, _, rest = bytes(self._buf).partition(b"\n")
        self._buf = bytearray(rest)
        return json.loads(line)

    def _upper_paths(self) -> set[str]:
        """Every path in the writable layer. Iterative (fdtree): what a call left behind
        may nest past Python 3.11's recursion limit, and must make the worker dirty, not
        fail the call."""
        upper = self.containers.upper_dir(self.rec)
        fd = os.open(upper, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            return {e.path for e in fdtree.walk(fd, ".")} - {"."}
        finally:
            os.close(fd)

    # ---- one call ----
    async def call(self, req: FnCallRequest) -> FnCallResult:
        """Run ``req``; never raises for what the call did, only for a broken worker."""
        assert self.proc is not None and self.healthy
        self.calls += 1
        plan = plan_call(req)
        wire = {
            "steps": [{"kind": s.kind, "argv": s.argv, "source": s.source, "stage": s.stage,
                       "payload": b64(s.payload)} for s in plan.steps],
            "files": {k: b64(v) for k, v in plan.files.items()},
            "return_files": req.return_files,
            "stdin": b64(req.stdin or b""),
            "env": req.env,
            "timeout": req.timeout,
            "cpu_time_s": req.cpu_time_s or req.timeout,
            "pids": req.pids,
            "fsize": req.disk_mb << 20,
            "max_output": req.max_output,
        }
        oom_before = self.containers.oom_kills(self.rec)
        t0 = time.perf_counter()
        self.proc.write_stdin(json.dumps(wire).encode() + b"\n")
        try:
            reply = await asyncio.wait_for(self._read_line(), req.timeout + REPLY_GRACE_S)
        # ValueError and RecursionError: a reply line that is not JSON, or nested past the
        # stack (the server shares its sandbox with the call's code)
        except (asyncio.TimeoutError, AgentGone, ValueError, RecursionError) as exc:
            self.healthy = False
            oom = self.containers.oom_kills(self.rec) > oom_before
            return FnCallResult(exit_code=-1, timed_out=isinstance(exc, asyncio.TimeoutError),
                                oom_killed=oom, worker=self.id,
                                stderr=f"fncall worker {self.id} failed: {exc!r}",
                                duration_ms=(time.perf_counter() - t0) * 1000)
        if "fatal" in reply:
            self.healthy = False
            raise Internal(f"fncall worker {self.id}: {reply['fatal']}")
        result = _result(reply, self.id, self.containers.oom_kills(self.rec) > oom_before)
        if result.timed_out or result.oom_killed or result.signal is not None \
                or self._upper_paths() != self._baseline:
            self.healthy = False
        return result

    async def stop(self) -> None:
        self.healthy = False
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.close()
        try:
            await self.containers.stop(self.rec)
        except DSecError:
            pass


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _result(reply: dict, worker_id: str, oom: bool) -> FnCallResult:
    steps = reply["steps"]
    last = steps[-1] if steps else {"exit_code": -1, "signal": None, "stdout": "",
                                    "stderr": "no step ran", "timed_out": False}
    compile_failed = last.get("stage") == "compile" and (last["exit_code"] != 0
                                                         or last["timed_out"])
    sig = last["signal"]
    timed_out = any(s["timed_out"] for s in steps) or sig == signal.SIGXCPU
    err = reply.get("error")
    return FnCallResult(
        exit_code=last["exit_code"], stdout=last["stdout"], stderr=last["stderr"],
        stdout_truncated=last.get("stdout_truncated", False),
        stderr_truncated=last.get("stderr_truncated", False),
        duration_ms=reply.get("duration_ms", 0.0), timed_out=timed_out,
        oom_killed=oom and sig == signal.SIGKILL, signal=sig, compile_failed=compile_failed,
        files={k: base64.b64decode(v) for k, v in reply.get("files", {}).items()},
        value=base64.b64decode(reply["value"]) if reply.get("value") else None,
        error=RemoteErrorInfo(**err) if err else None, worker=worker_id)

