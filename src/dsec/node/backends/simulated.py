"""A backend that keeps records and runs nothing: for control-plane benchmarks only.

A simulated sandbox is its record and nothing else: :meth:`SimulatedBackend.start` returns
at once, with no process, mount, cgroup or network namespace; stop, pause and resume are
bookkeeping. So a small machine can host a hundred and more node agents and measure what
the gateway, placement, the watcher and the HTTP path cost, with the node's own logic
(admission, the SQLite store, the reaper, the trajectory log) running for real.

Exec answers ``true`` (exit 0) and ``false`` (exit 1) in process, recorded in the
trajectory log like any exec; any other command, shells, streams, terminals and files are
:class:`~dsec.api.errors.Unsupported`. It is never registered by default nor reachable by
a backend name in :class:`~dsec.node.config.NodeConfig`: a node gets it only from
:func:`open_simulated_node`. Never give it to a node that serves real work.
"""

from __future__ import annotations

from pathlib import Path

from dsec.api.errors import Unsupported
from dsec.api.models import ExecRequest, ExecResult
from dsec.node.backends.base import Backend, SandboxRecord
from dsec.node.config import NodeConfig

__all__ = ["SimulatedBackend", "open_simulated_node"]

ANSWERS = {"true": 0, "false": 1}  # the only commands a simulated sandbox "runs"


class SimulatedBackend(Backend):
    """Records only. ``name`` is the backend the simulated sandboxes answer to (the
    default ``container``, so an unchanged client spec lands here)."""

    memory_read_is_cheap = True  # nothing to read

    def __init__(self, name: str = "container") -> None:
        self.name = name
        self.paused: set[str] = set()

    async def start(self, rec: SandboxRecord) -> dict:
        return {"simulated": True}

    async def stop(self, rec: SandboxRecord) -> None:
        self.paused.discard(rec.id)

    async def pause(self, rec: SandboxRecord) -> None:
        self.paused.add(rec.id)

    async def resume(self, rec: SandboxRecord) -> None:
        self.paused.discard(rec.id)

    async def alive(self, rec: SandboxRecord) -> bool:
        return True  # nothing runs, so nothing can die: the record is the sandbox

    async def exec(self, rec: SandboxRecord, req: ExecRequest) -> ExecResult:
        cmd = req.cmd if isinstance(req.cmd, str) else " ".join(req.cmd)
        code = ANSWERS.get(cmd.strip())
        if code is None:
            raise Unsupported(f"sandbox {rec.id} is simulated (a control-plane benchmark "
                              f"node): it answers only {sorted(ANSWERS)}; got {cmd[:60]!r}")
        return ExecResult(exit_code=code)

    def _lacks(self, what: str, rec: SandboxRecord) -> Unsupported:
        return Unsupported(f"sandbox {rec.id} is simulated: it has no {what}")

    def connector(self, rec: SandboxRecord):
        raise self._lacks("agent (shells, streams and terminals need one)", rec)

    def files(self, rec: SandboxRecord):
        raise self._lacks("files", rec)

    def oom_kills(self, rec: SandboxRecord) -> int:
        return 0

    def memory_bytes(self, rec: SandboxRecord) -> int:
        return 0


async def open_simulated_node(state_dir: Path, **config):
    """A :class:`~dsec.node.service.NodeService` whose only backend is simulated.

    It builds no image, agent binary or warm pool; ``config`` sets other
    :class:`NodeConfig` fields (admission, reaper period...)."""
    from dsec.node.service import NodeService
    backend = SimulatedBackend()
    cfg = NodeConfig(state_dir=state_dir, backends=[backend.name], **config)
    return await NodeService.open(cfg, backends={backend.name: backend})
