"""How long the trajectory log keeps a sandbox's entries, and which logs a pass deletes.

The plan is a pure function of the per-sandbox summaries, so each rule is tested without a
database. A running sandbox's log is never deleted, whatever its age or the file's size:
a trainer that reconnects to it fast-forwards from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["TrajectoryRetention", "LogSummary", "plan_prune"]

DAY = 86400.0


class TrajectoryRetention(BaseModel):
    """When the node deletes the trajectory logs of stopped sandboxes."""

    model_config = ConfigDict(extra="forbid")

    stopped_grace_s: float | None = Field(
        DAY, ge=0,
        description="a stopped sandbox's log (entries and audit records) is deleted this "
                    "long after the sandbox stopped; it stays readable until then. None: "
                    "kept until max_age_s or max_mb removes it")
    max_age_s: float | None = Field(
        7 * DAY, ge=0,
        description="a log is deleted once its newest entry is this old, unless its "
                    "sandbox is still running; this also covers sandboxes whose stop the "
                    "node never saw (a crash). None: no age limit")
    max_mb: float | None = Field(
        1024, ge=0,
        description="target size of the log file in MiB: beyond it, the logs of the "
                    "sandboxes that stopped longest ago are deleted until it fits. Logs of "
                    "running sandboxes are never deleted, so the file stays larger while "
                    "they need it. None: no size limit")
    interval_s: float = Field(60.0, gt=0, description="how often the node prunes the log")


@dataclass(frozen=True)
class LogSummary:
    """One sandbox's log as the planner sees it."""

    sandbox: str
    last_at: float               # time of its newest entry or audit record
    ended_at: float | None       # when the node saw it stop, if it did
    bytes: int                   # payload bytes of its rows (requests, results, details)

    @property
    def stopped_at(self) -> float:
        return self.ended_at if self.ended_at is not None else self.last_at


def plan_prune(logs: list[LogSummary], live: set[str], now: float,
               policy: TrajectoryRetention, used_bytes: int) -> list[str]:
    """The sandboxes whose logs go, oldest stop first.

    ``live``: sandboxes still running (never pruned). ``used_bytes``: bytes the file's
    live pages hold; each log's share of it is taken as proportional to its payload."""
    stopped = sorted((s for s in logs if s.sandbox not in live), key=lambda s: s.stopped_at)
    doomed = [s for s in stopped if _expired(s, now, policy)]
    if policy.max_mb is not None:
        payload = sum(s.bytes for s in logs) or 1
        scale = used_bytes / payload
        left = used_bytes - scale * sum(s.bytes for s in doomed)
        gone = {s.sandbox for s in doomed}
        for s in stopped:
            if left <= policy.max_mb * (1 << 20):
                break
            if s.sandbox not in gone:
                doomed.append(s)
                left -= scale * s.bytes
        doomed.sort(key=lambda s: s.stopped_at)
    return [s.sandbox for s in doomed]


def _expired(s: LogSummary, now: float, policy: TrajectoryRetention) -> bool:
    if policy.stopped_grace_s is not None and s.ended_at is not None \
            and now - s.ended_at >= policy.stopped_grace_s:
        return True
    return policy.max_age_s is not None and now - s.last_at >= policy.max_age_s
