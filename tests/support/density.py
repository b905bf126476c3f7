"""Waiting on a node's density work from a test."""

from __future__ import annotations

import asyncio

__all__ = ["reclaimed"]


async def reclaimed(node, sb_id: str, polls: int = 600):
    """The sandbox's info once its reclaim has ended (``reclaim`` set and no longer
    ``reclaiming…``), asked every 0.1 s at most ``polls`` times; AssertionError after."""
    for _ in range(polls):
        info = await node.get(sb_id)
        if info.reclaim and not info.reclaim.startswith("reclaiming"):
            return info
        await asyncio.sleep(0.1)
    raise AssertionError(f"reclaim of {sb_id} did not end: {info.reclaim}")
