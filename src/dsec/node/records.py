"""The node's live sandbox records, with running totals of what they reserve.

Admission asks for the node's load on every create; summing every record's reservation
each time made a create O(sandboxes) (at 3,200 sandboxes, most of a create's CPU). The
totals move as records come and go instead, so the load is O(1).
"""

from __future__ import annotations

from dsec.node.backends.base import SandboxRecord

__all__ = ["Records"]


class Records(dict[str, SandboxRecord]):
    """``id -> record``; ``memory_mb`` and ``cpu`` total what the records reserve, each
    counted as it was when its record went in (a spec's reservation never changes while
    its record is live)."""

    def __init__(self) -> None:
        super().__init__()
        self.memory_mb = 0
        self.cpu = 0.0
        self._held: dict[str, tuple[int, float]] = {}

    def __setitem__(self, key: str, rec: SandboxRecord) -> None:
        self._forget(key)
        held = (rec.spec.memory_mb, rec.spec.cpu)
        self._held[key] = held
        self.memory_mb += held[0]
        self.cpu += held[1]
        super().__setitem__(key, rec)

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        self._forget(key)

    def pop(self, key: str, *default):
        out = super().pop(key, *default)
        self._forget(key)
        return out

    def _forget(self, key: str) -> None:
        held = self._held.pop(key, None)
        if held is not None:
            self.memory_mb -= held[0]
            self.cpu -= held[1]
            if not self._held:  # no float drift left behind once empty
                self.memory_mb, self.cpu = 0, 0.0

    def clear(self) -> None:
        super().clear()
        self._held.clear()
        self.memory_mb, self.cpu = 0, 0.0
