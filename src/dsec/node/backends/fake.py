"""A backend for tests of the node's own logic (store, reaper, TTLs, recovery, exec plumbing).

Each "sandbox" is a dsec-agent process on the host, serving a unix socket in a temporary
directory, with that directory as its file root. Nothing is isolated: never register it on a
real node. It exists so NodeService can be tested without runc, in milliseconds.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

from dsec.node.agent.client import AgentConnector, ping, unix_connector
from dsec.node.backends.base import Backend, SandboxRecord
from dsec.node.files import FileOps
from dsec.node.host.rooted import RootedFiles

__all__ = ["FakeBackend"]


class FakeBackend(Backend):
    """Runs the real agent as a plain host process per sandbox (no isolation)."""

    name = "container"
    memory_read_is_cheap = True  # nothing to read

    def __init__(self, state_dir: Path, agent_binary: Path) -> None:
        self.state_dir = state_dir
        self.agent_binary = agent_binary
        self.paused: set[str] = set()

    def _dir(self, sb_id: str) -> Path:
        return self.state_dir / "sandboxes" / sb_id

    async def start(self, rec: SandboxRecord) -> dict:
        d = self._dir(rec.id)
        (d / "root" / "tmp").mkdir(parents=True, exist_ok=True)
        # the agent binds a path relative to its cwd: deep test dirs exceed sun_path's 108 bytes
        proc = subprocess.Popen([str(self.agent_binary), "serve-unix", "agent.sock"], cwd=d,
                                start_new_session=True, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        (d / "pid").write_text(str(proc.pid))
        for _ in range(200):
            if await ping(self.connector(rec), timeout=0.05):
                break
        return {"dir": str(d), "init_pid": proc.pid, "image_cwd": str(d / "root")}

    async def stop(self, rec: SandboxRecord) -> None:
        d = self._dir(rec.id)
        try:
            pid = int((d / "pid").read_text())
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (OSError, ValueError):
            pass
        shutil.rmtree(d, ignore_errors=True)

    async def pause(self, rec: SandboxRecord) -> None:
        self.paused.add(rec.id)

    async def resume(self, rec: SandboxRecord) -> None:
        self.paused.discard(rec.id)

    async def alive(self, rec: SandboxRecord) -> bool:
        return await ping(self.connector(rec), timeout=1.0)

    def connector(self, rec: SandboxRecord) -> AgentConnector:
        return unix_connector(str(self._dir(rec.id) / "agent.sock"))

    def files(self, rec: SandboxRecord) -> FileOps:
        return RootedFiles(str(self._dir(rec.id) / "root"))

    def oom_kills(self, rec: SandboxRecord) -> int:
        return 0

    def memory_bytes(self, rec: SandboxRecord) -> int:
        return 0
