"""The contract every backend keeps, and the record the node keeps per sandbox.

:class:`Backend` lists every verb the node may call. A backend overrides what it offers;
what it does not offer raises :class:`~dsec.api.errors.Unsupported` from here, so a missing
capability is always the same clear error (never an absent method or a silent no-op) and
the node never probes a backend with ``hasattr``.

A backend starts, stops, pauses and resumes sandboxes and says how to reach the in-sandbox
agent and the sandbox's files. Exec, shells, streaming, limits on output and the trajectory
log are written once in the node on top of that (:meth:`Backend.exec` defaults to it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from dsec.api.errors import Unsupported

if TYPE_CHECKING:
    from dsec.api.models import ExecEvent, ExecRequest, ExecResult, SandboxSpec
    from dsec.images.models import LayerInfo
    from dsec.node.agent.client import AgentConnector
    from dsec.node.files import FileOps

__all__ = ["Backend", "Reclaim", "ReclaimPlan", "SandboxRecord"]


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


@dataclass(frozen=True)
class ReclaimPlan:
    """How far the node lets one reclaim go."""

    swap_bytes: int   # the sandbox may hold this much in swap while paused
    step_bytes: int   # pushed out per step; a resume waits for at most one step
    cancelled: object = staticmethod(lambda: False)  # polled between steps


@dataclass
class Reclaim:
    """What one reclaim of a paused sandbox did."""

    before_bytes: int   # memory charged to the sandbox when it started
    after_bytes: int    # memory charged once it ended
    swapped_bytes: int  # of the sandbox's memory, what sits in swap now
    complete: bool      # False: stopped early (swap full, cancelled, no progress)
    note: str = ""      # why it stopped early, for the log and the sandbox's info
    refaults: int = 0   # the cgroup's refault count after it (idle reclaim watches it)
    pressure: float | None = None  # the cgroup's memory PSI some avg10, where it has one

    @property
    def freed_bytes(self) -> int:
        return max(0, self.before_bytes - self.after_bytes)


class Backend:
    """One way of running sandboxes on this node. Subclasses set :attr:`name` and override
    the verbs they offer; see the module docstring."""

    name: ClassVar[str] = ""
    #: CPU classes a sandbox of this backend may ask for (``SandboxSpec.cpu_class``).
    cpu_classes: ClassVar[frozenset[str]] = frozenset({"latency"})
    #: The node's layer store when this backend has one (``None``: no images here).
    images = None
    #: Whether :meth:`reclaim` and :meth:`restore` work here (the node sets up swap and
    #: starts background reclaims only for such backends).
    can_reclaim: ClassVar[bool] = False
    #: Whether :meth:`memory_bytes` only reads a counter the kernel keeps (a cgroup file)
    #: or nothing: the node then calls it on its loop, not in a thread (a thread hop cost
    #: a sandbox's ``get`` more than the read).
    memory_read_is_cheap: ClassVar[bool] = False

    def _unsupported(self, what: str, rec: SandboxRecord | None = None) -> Unsupported:
        name = rec.spec.backend if rec is not None else self.name
        return Unsupported(f"{name} sandboxes cannot {what}")

    # ---- lifecycle: every backend has these ----
    async def start(self, rec: SandboxRecord) -> dict:
        """Create and start the sandbox; return backend runtime info to persist."""
        raise NotImplementedError

    async def stop(self, rec: SandboxRecord) -> None:
        """Remove every process, mount, cgroup, file of the sandbox. Idempotent."""
        raise NotImplementedError

    async def alive(self, rec: SandboxRecord) -> bool:
        """Whether the sandbox still runs (used when the node restarts)."""
        raise NotImplementedError

    async def close(self) -> None:
        """Release node-wide resources (worker pools) when the node closes."""

    async def apply_spec(self, rec: SandboxRecord) -> None:
        """Give a running (pooled) sandbox the limits of ``rec.spec``."""
        raise self._unsupported("be taken from a warm pool", rec)

    # ---- pause, and the memory a paused sandbox gives back ----
    async def pause(self, rec: SandboxRecord) -> None:
        """Freeze every process of the sandbox (at once: reclaim is separate)."""
        raise self._unsupported("pause", rec)

    async def resume(self, rec: SandboxRecord) -> None:
        """Undo :meth:`pause`; :meth:`restore` has run first when memory was reclaimed."""
        raise self._unsupported("resume", rec)

    def reclaim(self, rec: SandboxRecord, plan: ReclaimPlan) -> Reclaim:
        """Push a paused sandbox's memory out to swap and out of the page cache (blocking:
        the node runs it in a thread). ``plan.cancelled()`` is polled between steps: when
        it turns true (a request wants the sandbox) the reclaim ends at once."""
        raise self._unsupported("give memory back while paused", rec)

    def restore(self, rec: SandboxRecord) -> None:
        """Undo :meth:`reclaim`: limits as the spec says, swapped memory read back."""
        raise self._unsupported("give memory back while paused", rec)

    def reclaim_idle(self, rec: SandboxRecord, plan: ReclaimPlan) -> Reclaim:
        """One step of pushing a running, idle sandbox's coldest memory out, without
        freezing it (blocking). ``complete`` in the result: little was left to push."""
        raise self._unsupported("give memory back while idle", rec)

    def memory_bytes(self, rec: SandboxRecord) -> int:
        """Host memory the sandbox is charged for now."""
        raise self._unsupported("report their memory", rec)

    def oom_kills(self, rec: SandboxRecord) -> int:
        """OOM kills so far in the sandbox (compared before/after an exec)."""
        raise self._unsupported("report OOM kills", rec)

    # ---- exec, agent, files ----
    async def exec(self, rec: SandboxRecord, req: ExecRequest) -> ExecResult:
        """Run one command; by default through the in-sandbox agent."""
        from dsec.node.execution import run_exec
        return await run_exec(self, rec, req)

    def exec_events(self, rec: SandboxRecord, req: ExecRequest) -> AsyncIterator[ExecEvent]:
        """Run one command, streaming; by default through the in-sandbox agent."""
        from dsec.node.execution import exec_events
        return exec_events(self, rec, req)

    def connector(self, rec: SandboxRecord) -> AgentConnector:
        """How to open a connection to the sandbox's agent."""
        raise self._unsupported("open shells or agent connections", rec)

    def files(self, rec: SandboxRecord) -> FileOps:
        """File operations confined to the sandbox's root."""
        raise self._unsupported("read or write files", rec)

    async def pack_diff(self, rec: SandboxRecord, tag: str, exclude: list[str]) -> LayerInfo:
        """Pack the writable layer as a new layer over the sandbox's image, tagged ``tag``."""
        raise self._unsupported("pack their writable layer", rec)

    def upper_dir(self, rec: SandboxRecord) -> Path:
        """The host directory holding the sandbox's writable layer."""
        raise self._unsupported("pack their writable layer", rec)

    # ---- display and input ----
    async def screenshot(self, rec: SandboxRecord) -> bytes:
        """A PNG of the sandbox's display."""
        raise Unsupported(f"{rec.spec.backend} sandboxes have no display; use backend='vm'")

    async def type_text(self, rec: SandboxRecord, text: str) -> None:
        """Type ``text`` on the sandbox's keyboard."""
        raise Unsupported(f"{rec.spec.backend} sandboxes have no keyboard or pointer; "
                          "use backend='vm'")

    async def press_keys(self, rec: SandboxRecord, keys: list[str]) -> None:
        """Press ``keys`` together (a chord) on the sandbox's keyboard."""
        raise Unsupported(f"{rec.spec.backend} sandboxes have no keyboard or pointer; "
                          "use backend='vm'")

    async def click(self, rec: SandboxRecord, x: int, y: int, button: str = "left") -> None:
        """Click at (x, y) on the sandbox's display."""
        raise Unsupported(f"{rec.spec.backend} sandboxes have no keyboard or pointer; "
                          "use backend='vm'")

    def console(self, rec: SandboxRecord) -> str:
        """The sandbox's console output so far, for debugging."""
        raise self._unsupported("show a console", rec)
