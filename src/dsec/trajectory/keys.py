"""Step keys from a per-client sequence, for callers that do not name their steps.

    steps = StepSequence("ep3/")
    await sb.exec("make", step=steps.next())      # ep3/0, ep3/1, ...

A trainer that restarts builds a new sequence with the same prefix and re-issues its
calls: the keys come out the same, so the logged calls are answered from the log.
"""

from __future__ import annotations

import itertools

__all__ = ["StepSequence"]


class StepSequence:
    """``prefix0``, ``prefix1``, ...: deterministic step keys in call order."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix
        self._n = itertools.count()

    def next(self) -> str:
        return f"{self.prefix}{next(self._n)}"
