"""The protocol every backend implements, and the record the node keeps per sandbox.

A backend only starts, stops, pauses and resumes sandboxes and says how to reach the
in-sandbox agent and the sandbox's files. Exec, shells, streaming, limits on output and
the trajectory log are written once in the node on top of that.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from dsec.api.models import SandboxSpec
from dsec.node.agent.client import AgentConnector
from dsec.node.files import FileOps

__all__ = ["Backend", "SandboxRecord"]


@dataclass
class SandboxRecord:
    """The node's durable view of one sandbox (one row in its SQLite store)."""

    id: str
    spec: SandboxSpec
    state: str
    created_at: float
    last_active_at: float
    expires_at: float | None = None
    runtime: dict = field(default_factory=dict)  # backend-owned: paths, pids, ports
    error: str | None = None


@runtime_checkable
class Backend(Protocol):
    """One way of running sandboxes on this node."""

    name: str

    async def start(self, rec: SandboxRecord) -> dict:
        """Create and start the sandbox; return backend runtime info to persist."""

    async def stop(self, rec: SandboxRecord) -> None:
        """Remove every process, mount, cgroup, file of the sandbox. Idempotent."""

    async def pause(self, rec: SandboxRecord) -> None:
        """Freeze every process of the sandbox."""

    async def resume(self, rec: SandboxRecord) -> None:
        """Undo :meth:`pause`."""

    async def alive(self, rec: SandboxRecord) -> bool:
        """Whether the sandbox still runs (used when the node restarts)."""

    def connector(self, rec: SandboxRecord) -> AgentConnector:
        """How to open a connection to the sandbox's agent."""

    def files(self, rec: SandboxRecord) -> FileOps:
        """File operations confined to the sandbox's root."""

    def oom_kills(self, rec: SandboxRecord) -> int:
        """OOM kills so far in the sandbox (compared before/after an exec)."""

    def memory_bytes(self, rec: SandboxRecord) -> int:
        """Host memory the sandbox is charged for now."""
