"""What a node remembers, briefly, of sandboxes it stopped on its own.

A sandbox whose ``ttl_s`` ran out (or that sat idle past ``idle_ttl_s``) is gone from the
node's records, but a client asking for it should hear that it expired, not that no such
sandbox ever existed. This keeps the id, its project, why and when, in memory only, for
at most :data:`KEEP_S` seconds and :data:`KEEP_COUNT` sandboxes (oldest forgotten first).
Only a caller that sees the sandbox's project hears it: to any other, an ended sandbox is
one that does not exist, as a live one is.
"""

from __future__ import annotations

import time
from collections import OrderedDict

from dsec.api.errors import SandboxStopped
from dsec.api.scope import visible

__all__ = ["EndedSandboxes", "KEEP_S", "KEEP_COUNT"]

KEEP_S = 3600.0
KEEP_COUNT = 10_000


class EndedSandboxes:
    """sandbox id -> (why it ended, when, its project), bounded in time and count."""

    def __init__(self, keep_s: float = KEEP_S, keep_count: int = KEEP_COUNT) -> None:
        self.keep_s, self.keep_count = keep_s, keep_count
        self._ended: OrderedDict[str, tuple[str, float, str | None]] = OrderedDict()

    def remember(self, sb_id: str, why: str, at: float | None = None,
                 project: str | None = None) -> None:
        self._ended[sb_id] = (why, time.time() if at is None else at, project)
        self._ended.move_to_end(sb_id)
        while len(self._ended) > self.keep_count:
            self._ended.popitem(last=False)

    def error(self, sb_id: str, now: float | None = None) -> SandboxStopped | None:
        """The error a request for ``sb_id`` gets, if it ended here lately and the
        current request's scope sees its project."""
        now = time.time() if now is None else now
        while self._ended:  # forget what is past keep_s, oldest first
            oldest, (_, at, _) = next(iter(self._ended.items()))
            if now - at <= self.keep_s:
                break
            self._ended.popitem(last=False)
        got = self._ended.get(sb_id)
        if got is None or not visible(got[2]):
            return None
        why, at, _ = got
        return SandboxStopped(f"sandbox {sb_id} {why} {max(0, now - at):.0f}s ago and was "
                              "stopped; create a new one (extend a running sandbox's life "
                              "with set_timeout, or give create a longer ttl_s)")

    def __contains__(self, sb_id: str) -> bool:
        return self.error(sb_id) is not None
