"""The trajectory log: every mutating call on a sandbox with its result, and replay.

Node side: :class:`~dsec.trajectory.recorder.Recorder` (with :mod:`.log` and the pure
matching in :mod:`.replay`). Client side: :func:`replay` re-runs a logged trajectory into a
fresh sandbox.
"""

from dsec.trajectory.keys import StepSequence
from dsec.trajectory.replay import Decision, KeyIndex, decide, fingerprint
from dsec.trajectory.rerun import ReplayReport, load_log, replay

__all__ = ["replay", "load_log", "ReplayReport", "StepSequence", "decide", "fingerprint",
           "KeyIndex", "Decision"]
