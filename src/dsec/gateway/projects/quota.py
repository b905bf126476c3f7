"""Quota arithmetic, free of I/O: what a child may be given, and whether a create fits.

A project's quota bounds what it and everything below it hold at once. A child's quota
is taken out of its parent's: the children's quotas of one field together never exceed
the parent's (a child that leaves a field unset takes nothing and shares what the
parent has left). Creations per second are a token bucket per project holding one
second's worth (at least one).
"""

from __future__ import annotations

from dataclasses import dataclass

from dsec.api.projects import Quota, Usage

__all__ = ["Ask", "FIELDS", "grant_problem", "admit_problem", "refill", "given"]

FIELDS = ("sandboxes", "cpu", "memory_mb", "creations_per_s")
_HELD = ("sandboxes", "cpu", "memory_mb")
_EPS = 1e-9  # float sums of CPU quotas (0.1 + 0.2) must not refuse an exact fit


@dataclass(frozen=True)
class Ask:
    """What ``count`` sandboxes of one spec take."""

    count: int
    cpu: float
    memory_mb: int

    def amount(self, name: str) -> float:
        return {"sandboxes": self.count, "cpu": self.cpu * self.count,
                "memory_mb": self.memory_mb * self.count}[name]


def given(children: list[Quota]) -> Quota:
    """Per field, the sum of what the children were given (None where none set it)."""
    out = {}
    for name in FIELDS:
        vals = [getattr(q, name) for q in children if getattr(q, name) is not None]
        out[name] = sum(vals) if vals else None
    return Quota(**out)


def grant_problem(path: str, parent_path: str, parent: Quota, siblings: list[Quota],
                  ask: Quota) -> str | None:
    """Why ``ask`` cannot be the quota of ``path`` under ``parent`` whose other children
    hold ``siblings``; None if it can."""
    taken = given(siblings)
    for name in FIELDS:
        want, top = getattr(ask, name), getattr(parent, name)
        if want is None or top is None:
            continue
        left = top - (getattr(taken, name) or 0)
        if want > left + _EPS:
            where = repr(parent_path) if parent_path else "the root project"
            return (f"quota.{name} of {path!r} asks {want:g}, but {where} has {left:g} of its "
                    f"{top:g} not given to other sub-projects; ask for at most {max(left, 0):g}")
    return None


def admit_problem(chain: list[tuple[str, Quota, Usage]], ask: Ask) -> str | None:
    """Why ``ask`` does not fit under every quota on the way from the root to the project
    (``chain`` holds each level's path, quota and rolled-up usage); None if it fits."""
    for path, quota, usage in chain:
        for name in _HELD:
            top = getattr(quota, name)
            if top is None:
                continue
            used = getattr(usage, name)
            if used + ask.amount(name) > top + _EPS:
                where = repr(path) if path else "the root project"
                return (f"{where} holds {used:g} of its quota.{name} {top:g}; this create "
                        f"asks {ask.amount(name):g} more")
    return None


def refill(tokens: float | None, at: float | None, rate: float, now: float) -> float:
    """The bucket of a creation rate ``rate`` at ``now``; a new bucket starts full."""
    burst = max(1.0, rate)
    if tokens is None or at is None:
        return burst
    return min(burst, tokens + max(0.0, now - at) * rate)
