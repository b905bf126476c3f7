"""A worker for images without Python (busybox): programs started by the in-sandbox agent.

There is no warm interpreter to fork, so each step is one agent spawn, as the worker's call
uid, through a ``/bin/sh`` wrapper that lowers the rlimits (CPU time, file size, open files,
processes) and raises its ``oom_score_adj`` before exec'ing the program. The node prepares
and wipes the scratch directory from the host through the sandbox's root mount; after the
call, a kill(-1) as the call uid ends leftovers and a root spawn empties /dev/shm and
/dev/mqueue (the container's own, outside its upper layer). Only argv steps run here: sh, and bash, C or
C++ when the image has them; Python code and callables need a Python image.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

from dsec.api.fncall import FnCallRequest, FnCallResult
from dsec.node.agent.client import AgentGone, AgentProcess, SpawnRequest
from dsec.node.backends.fncall.plan import Step, plan_call
from dsec.node.backends.fncall.worker import Worker
from dsec.node.execution import OutputCap
from dsec.node.host.fdtree import rmtree

__all__ = ["ShellWorker"]

SCRATCH = "fn/call"
WIPE_HOST = ("tmp", "var/tmp")
WRAP = ('echo 1000 > /proc/self/oom_score_adj; ulimit -t "$1" && ulimit -f "$2" && '
        'ulimit -n 256 && ulimit -u "$3" || { echo "fncall: cannot set limits" >&2; exit 126; }'
        '; shift 3; exec "$@"')
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MAX_FILE = 16 << 20


class ShellWorker(Worker):
    """See the module docstring."""

    def supports(self, req: FnCallRequest) -> str | None:
        if req.language == "python":
            return (f"image {self.rec.spec.image!r} has no python3: it runs sh (and what "
                    "else it has) only; use image='python:3.11' for Python")
        return None

    def _root(self) -> Path:
        return self.containers.sandbox_dir(self.id) / "rootfs"

    async def _start_server(self, preload: tuple[str, ...]) -> None:
        root = self._root()
        (root / "fn").mkdir(mode=0o711, exist_ok=True)
        for d in WIPE_HOST:  # copy up now so the snapshot holds them (see server.py)
            if (root / d).is_dir():
                os.chmod(root / d, (root / d).stat().st_mode & 0o7777)
        self._wiped = {d: set(os.listdir(root / d)) if (root / d).is_dir() else set()
                       for d in WIPE_HOST}
        self.info = {"ready": True, "python": None}
        self._baseline = self._upper_paths()

    async def call(self, req: FnCallRequest) -> FnCallResult:
        self.calls += 1
        plan = plan_call(req)
        t0 = time.perf_counter()
        deadline = time.monotonic() + req.timeout
        oom_before = self.containers.oom_kills(self.rec)
        await asyncio.to_thread(self._make_scratch, plan.files)
        out = None
        try:
            for i, step in enumerate(plan.steps):
                stdin = (req.stdin or b"") if i == len(plan.steps) - 1 else b""
                out = await self._run(step, req, stdin, deadline)
                await self._kill()  # before any host-side look at the files it left
                if out.exit_code != 0 or out.timed_out:
                    out.compile_failed = step.stage == "compile"
                    break
            assert out is not None
            out.files = await asyncio.to_thread(self._collect, req.return_files)
        except AgentGone as exc:
            self.healthy = False
            out = FnCallResult(exit_code=-1, stderr=f"fncall worker {self.id} failed: {exc}")
        finally:
            await self._reset()
        out.oom_killed = out.signal == signal.SIGKILL and \
            self.containers.oom_kills(self.rec) > oom_before
        out.duration_ms = (time.perf_counter() - t0) * 1000
        out.worker = self.id
        if out.timed_out or out.oom_killed or out.signal is not None \
                or self._upper_paths() != self._baseline:
            self.healthy = False
        return out

    async def _run(self, step: Step, req: FnCallRequest, stdin: bytes,
                   deadline: float) -> FnCallResult:
        cpu = max(1, int((req.cpu_time_s or req.timeout) + 0.999))
        blocks = (req.disk_mb << 20) // 512  # ash and dash count ulimit -f in 512 bytes
        env = {"PATH": PATH, "HOME": "/" + SCRATCH, "TMPDIR": "/" + SCRATCH, **req.env}
        spawn = SpawnRequest(argv=["/bin/sh", "-c", WRAP, "fncall", str(cpu), str(blocks),
                                   str(req.pids), *step.argv],
                             env=env, cwd="/" + SCRATCH, uid=self.uid, gid=self.uid)
        proc = await AgentProcess.start(self.containers.connector(self.rec), spawn)
        try:
            if stdin:
                proc.write_stdin(stdin)
            proc.close_stdin()
            caps = {"stdout": OutputCap(req.max_output), "stderr": OutputCap(req.max_output)}
            timed_out = False
            while True:
                left = deadline - time.monotonic()
                try:
                    kind, data = await asyncio.wait_for(proc.next_event(), max(left, 0.0)
                                                        if not timed_out else 5.0)
                except asyncio.TimeoutError:
                    if timed_out:
                        raise AgentGone("the program did not die after SIGKILL") from None
                    timed_out = True
                    proc.send_signal(signal.SIGKILL)
                    continue
                if kind == "exit":
                    break
                caps[kind].feed(data)
        finally:
            proc.close()
        sig = proc.signal
        return FnCallResult(
            exit_code=proc.exit_code if proc.exit_code is not None else -1,
            stdout=caps["stdout"].text(), stderr=caps["stderr"].text(),
            stdout_truncated=caps["stdout"].truncated, stderr_truncated=caps["stderr"].truncated,
            timed_out=timed_out or sig == signal.SIGXCPU, signal=sig)

    async def _spawn(self, argv: list[str], uid: int) -> None:
        proc = await AgentProcess.start(self.containers.connector(self.rec),
                                        SpawnRequest(argv=argv, env={"PATH": PATH}, cwd="/",
                                                     uid=uid, gid=uid))
        try:
            proc.close_stdin()
            while (await asyncio.wait_for(proc.next_event(), 30))[0] != "exit":
                pass
        finally:
            proc.close()

    async def _kill(self) -> None:
        """SIGKILL every process of the call uid (kill(-1) as that uid spares only itself)."""
        await self._spawn(["/bin/sh", "-c", "kill -9 -1"], self.uid)

    async def _reset(self) -> None:
        """Kill the call uid's processes, then wipe what a call may have written."""
        try:
            await self._kill()
            await self._spawn(["/bin/sh", "-c", "rm -rf /dev/shm/* /dev/shm/.[!.]* "
                               "/dev/mqueue/* 2>/dev/null; true"], 0)
        except (AgentGone, asyncio.TimeoutError):
            self.healthy = False
        await asyncio.to_thread(self._wipe)

    def _make_scratch(self, files: dict[str, bytes]) -> None:
        d = self._root() / SCRATCH
        rmtree(d)
        d.mkdir(mode=0o700)
        for rel, data in files.items():
            path = d / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        for root, dirs, names in os.walk(d):
            for n in [*dirs, *names, ""]:
                os.lchown(os.path.join(root, n) if n else root, self.uid, self.uid)

    def _collect(self, paths: list[str]) -> dict[str, bytes]:
        d = os.path.realpath(self._root() / SCRATCH)
        out = {}
        for rel in paths:
            real = os.path.realpath(os.path.join(d, rel))
            if not real.startswith(d + "/") or not os.path.isfile(real):
                continue
            try:
                fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                continue
            with os.fdopen(fd, "rb") as f:
                out[rel] = f.read(MAX_FILE)
        return out

    def _wipe(self) -> None:
        root = self._root()
        rmtree(root / SCRATCH)  # iterative: a call's code can nest it thousands deep
        for d, before in self._wiped.items():
            if not (root / d).is_dir():
                continue
            for name in os.listdir(root / d):
                if name in before:
                    continue
                rmtree(root / d / name)
