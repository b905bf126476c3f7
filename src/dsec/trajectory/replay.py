"""Replay matching, free of I/O: is a call live, answered from the log, or a divergence?

Only calls with a step key take part. Keyed entries of a sandbox's log form a sequence; a
*cursor* (in memory, per sandbox) says which keyed entry the next re-issued step must be.

- A step whose key is in the log, with the same request fingerprint, is answered from the
  log. It may start a replay at any position (a trainer resuming from its own checkpoint),
  but once a replay runs, each next step must be the next keyed entry.
- A step whose key is not in the log runs live, unless a replay is under way and keyed
  entries remain: that is a divergence, never a silent re-run.
- A call without a key runs live and ends any replay under way.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Literal

from dsec.api.errors import TrajectoryDiverged

__all__ = ["fingerprint", "Decision", "KeyIndex", "decide", "REQUEST_FIELDS"]

# The request fields that define a step. Timeouts, output caps and the key itself may
# change between the first run and a replay without changing what the step is.
REQUEST_FIELDS: dict[str, tuple[str, ...]] = {
    "exec": ("cmd", "cwd", "env", "user", "stdin", "background"),
    "shell_run": ("cmd",),
    "file_write": ("path", "mode", "sha256"),
    "pack_diff": ("tag", "exclude"),
}


def fingerprint(kind: str, request: dict) -> str:
    """A short stable hash of the fields of ``request`` that define a ``kind`` step."""
    fields = {k: request.get(k) for k in REQUEST_FIELDS[kind]}
    blob = json.dumps([kind, fields], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


@dataclass
class KeyIndex:
    """The keyed entries of one sandbox's log, and the replay cursor."""

    keys: list[str] = field(default_factory=list)
    by_key: dict[str, tuple[int, int, str]] = field(default_factory=dict)  # pos, seq, fp
    cursor: int | None = None  # position of the keyed entry expected next; None = live

    @classmethod
    def of(cls, keyed: list[tuple[str, int, str]]) -> KeyIndex:
        idx = cls()
        for step, seq, fp in keyed:
            idx.add(step, seq, fp)
        return idx

    def add(self, step: str, seq: int, fp: str) -> None:
        self.by_key[step] = (len(self.keys), seq, fp)
        self.keys.append(step)


@dataclass(frozen=True)
class Decision:
    action: Literal["live", "replay"]
    seq: int | None = None          # the log entry that answers a replay
    cursor: int | None = None       # the cursor after this call


def decide(index: KeyIndex, step: str | None, fp: str) -> Decision:
    """What to do with a call carrying ``step`` and request fingerprint ``fp``."""
    if step is None:
        return Decision("live", cursor=None)
    hit = index.by_key.get(step)
    if hit is None:
        if index.cursor is not None:
            raise TrajectoryDiverged(
                f"step {step!r} is not in the log, but the replay expects step "
                f"{index.keys[index.cursor]!r} (position {index.cursor} of "
                f"{len(index.keys)}); re-issue the logged steps in order first")
        return Decision("live", cursor=None)
    pos, seq, logged_fp = hit
    if logged_fp != fp:
        raise TrajectoryDiverged(
            f"step {step!r} was logged with a different request than the one re-issued; "
            f"use a new step key for a new action")
    if index.cursor is not None and pos != index.cursor:
        raise TrajectoryDiverged(
            f"step {step!r} is logged at position {pos}, but the replay expects step "
            f"{index.keys[index.cursor]!r} at position {index.cursor}")
    nxt = pos + 1
    return Decision("replay", seq=seq, cursor=nxt if nxt < len(index.keys) else None)
