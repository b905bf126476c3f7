"""Warm pool: container sandboxes started ahead of demand, handed out by ``create``.

RL trainers create sandboxes in bursts; ``runc run`` costs ~30 ms of CPU each, so a burst
on a 2-core node is CPU-bound. A pooled sandbox is already running with the image's
rootfs, its own id and hostname; taking one only rewrites its cgroup limits and disk size
(microseconds) and records the caller's spec. Only specs that a pooled sandbox can become
are served: container backend, no extra layers, ``network="none"``, a pooled image.
The pool refills in the background when no user create is in flight.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from dsec.api.models import SandboxSpec
from dsec.node.backends.base import SandboxRecord

__all__ = ["WarmPool"]

log = logging.getLogger("dsec.node.pool")


class WarmPool:
    """Started sandboxes per image, waiting for a matching create."""

    def __init__(self, targets: dict[str, int]) -> None:
        self.targets = {k: v for k, v in targets.items() if v > 0}
        self.members: dict[str, list[SandboxRecord]] = {k: [] for k in self.targets}

    def matches(self, spec: SandboxSpec) -> bool:
        return (spec.backend == "container" and spec.network == "none" and not spec.layers
                and spec.image in self.targets)

    def take(self, spec: SandboxSpec) -> SandboxRecord | None:
        if not self.matches(spec):
            return None
        members = self.members[spec.image]
        return members.pop() if members else None

    def add(self, rec: SandboxRecord) -> None:
        self.members.setdefault(rec.spec.image, []).append(rec)

    def size(self) -> int:
        return sum(len(m) for m in self.members.values())

    def missing(self) -> list[str]:
        """Images whose pool is below target, one entry per missing sandbox."""
        out = []
        for image, target in self.targets.items():
            out += [image] * max(0, target - len(self.members.get(image, [])))
        return out

    async def fill_forever(self, start: Callable[[str], Awaitable[SandboxRecord]],
                           busy: Callable[[], bool], idle_s: float = 0.2) -> None:
        """Start sandboxes for missing pool slots, one at a time, yielding to user creates."""
        while True:
            todo = self.missing()
            if not todo or busy():
                await asyncio.sleep(idle_s)
                continue
            try:
                self.add(await start(todo[0]))
            except Exception:  # a failing image must not kill the node; retry later
                log.exception("warm pool could not start a %s sandbox", todo[0])
                await asyncio.sleep(5)

    def drain(self) -> list[SandboxRecord]:
        out = [r for m in self.members.values() for r in m]
        for m in self.members.values():
            m.clear()
        return out
