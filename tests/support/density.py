"""Waiting on a node's density work from a test."""

from __future__ import annotations

import asyncio
from pathlib import Path

from dsec.node.host import mounts

__all__ = ["reclaimed", "sandbox_superblocks"]


async def reclaimed(node, sb_id: str, polls: int = 600):
    """The sandbox's info once its reclaim has ended (``reclaim`` set and no longer
    ``reclaiming…``), asked every 0.1 s at most ``polls`` times; AssertionError after."""
    for _ in range(polls):
        info = await node.get(sb_id)
        if info.reclaim and not info.reclaim.startswith("reclaiming"):
            return info
        await asyncio.sleep(0.1)
    raise AssertionError(f"reclaim of {sb_id} did not end: {info.reclaim}")


def sandbox_superblocks(node, sb_id: str) -> dict[str, tuple[str, str]]:
    """The superblocks a container sandbox adds: its host mounts (under its own directory)
    and those of its mount namespace the host does not have. {major:minor: (target, type)}."""
    rec = node.record(sb_id)
    host = mounts.superblocks(Path("/proc/self/mountinfo").read_text())
    inside = mounts.superblocks(Path(f"/proc/{rec.runtime['init_pid']}/mountinfo").read_text())
    own = {dev: m for dev, m in host.items() if m[0].startswith(rec.runtime["dir"] + "/")}
    own.update({dev: m for dev, m in inside.items() if dev not in host})
    return own
