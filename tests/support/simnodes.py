"""Simulated node agents (real node API on loopback, a backend that runs nothing) for
gateway tests, started and closed around a block."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from dsec.cluster.simulated import SimulatedNodes

__all__ = ["simulated_nodes"]


@contextlib.asynccontextmanager
async def simulated_nodes(root: Path, token: str, count: int = 2
                          ) -> AsyncIterator[SimulatedNodes]:
    """``count`` nodes with their state under ``root``, answering ``token`` (the
    gateway's); closed when the block ends."""
    nodes = SimulatedNodes(root, count, token)
    await nodes.start()
    try:
        yield nodes
    finally:
        await nodes.close()
