"""Re-run a whole trajectory into a fresh sandbox, for debugging and provenance.

``await replay(log, into=sandbox)`` issues every logged call again, in order, live, in a
sandbox created from the same image; the report says which steps gave the same result
(exit code and output) and which did not. Step keys are kept, so the new sandbox's own
log lines up with the old one.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field

from dsec.api.models import ExecResult
from dsec.api.rl import TrajectoryEntry
from dsec.sdk.sandbox import AsyncSandbox, AsyncShell

__all__ = ["replay", "ReplayReport", "load_log"]


@dataclass
class ReplayReport:
    same: list[int] = field(default_factory=list)        # seqs whose result matched
    different: list[int] = field(default_factory=list)   # seqs whose result did not
    skipped: list[tuple[int, str]] = field(default_factory=list)  # (seq, why)

    @property
    def faithful(self) -> bool:
        return not self.different and not self.skipped


async def load_log(sb: AsyncSandbox) -> list[TrajectoryEntry]:
    """Every entry of a sandbox's log (the sandbox may already be stopped)."""
    entries: list[TrajectoryEntry] = []
    while True:
        page = await sb.trajectory(offset=len(entries), limit=1000)
        entries += page.entries
        if not page.entries or len(entries) >= page.total:
            return entries


def _same(a: ExecResult, b: dict) -> bool:
    return (a.exit_code, a.stdout, a.stderr) == (b["exit_code"], b["stdout"], b["stderr"])


async def replay(log: list[TrajectoryEntry], into: AsyncSandbox) -> ReplayReport:
    """Re-run ``log`` live in ``into``; pack_diff steps and large file writes are skipped."""
    report = ReplayReport()
    shells: dict[str, AsyncShell] = {}
    try:
        for e in log:
            r = e.request
            if e.kind == "exec":
                stdin = base64.b64decode(r["stdin"]) if r.get("stdin") else None
                got = await into.exec(r["cmd"], cwd=r.get("cwd"), env=r.get("env"),
                                      user=r.get("user"), stdin=stdin, timeout=r.get("timeout"),
                                      max_output=r["max_output"], background=r["background"],
                                      step=e.step)
                (report.same if _same(got, e.result) else report.different).append(e.seq)
            elif e.kind == "shell_run":
                key = r.get("shell") or "default"
                if key not in shells:
                    shells[key] = await into.shell()
                got = await shells[key].run(r["cmd"], timeout=r.get("timeout"),
                                            max_output=r["max_output"], step=e.step)
                (report.same if _same(got, e.result) else report.different).append(e.seq)
            elif e.kind == "file_write" and r.get("content_b64") is not None:
                await into.files.write(r["path"], base64.b64decode(r["content_b64"]),
                                       mode=r["mode"])
                report.same.append(e.seq)
            else:
                why = "pack_diff is not repeated" if e.kind == "pack_diff" \
                    else "file content too large to have been logged"
                report.skipped.append((e.seq, why))
    finally:
        for sh in shells.values():
            await sh.close()
    return report
