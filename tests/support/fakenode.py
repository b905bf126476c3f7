"""A NodeService over the fake backend (the test agent on a unix socket, no runc)."""

from __future__ import annotations

from pathlib import Path

from dsec.node.agent.build import ensure_agent
from dsec.node.backends.fake import FakeBackend
from dsec.node.config import NodeConfig
from dsec.node.service import NodeService
from dsec.node.store import NodeStore

__all__ = ["fake_node"]


def fake_node(state_dir: Path, node_id: str) -> NodeService:
    """A node whose one backend is the fake, with its state in ``state_dir``."""
    config = NodeConfig(state_dir=state_dir, backends=["container"])
    backend = FakeBackend(state_dir, ensure_agent(state_dir / "bin"))
    return NodeService(config, {"container": backend}, NodeStore(state_dir / "node.db"), node_id)
