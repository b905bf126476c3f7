"""Grading an agent's work where the agent cannot reach the grader.

The defence against reward hacking chosen here is a *separate grading sandbox*: the
agent's writable layer is packed with ``pack_diff``, keeping only the workspace (every
path outside it is excluded, so a planted ``/bin/sh`` or a doctored ``/usr`` never reaches
the grader); a fresh sandbox is created from the packed image (the agent's image and
layers, then its workspace); the hidden grader files are written into it only then, and
the grading command runs there. The grader files never exist in the agent's sandbox, and
nothing the agent runs can see or change the grading sandbox.
"""

from __future__ import annotations

import posixpath
import secrets
from dataclasses import dataclass, field

from dsec.api.models import ExecResult
from dsec.sdk.sandbox import AsyncSandbox

__all__ = ["Grader", "grade", "outside"]


@dataclass
class Grader:
    """Hidden files and the command that judges a workspace; exit 0 means success.

    The command should run the agent's code in a child (``$(...)``, a subprocess), never
    source it into its own shell: an ``exit 0`` planted in the code would end the test
    with success."""

    workspace: str
    cmd: str
    files: dict[str, bytes] = field(default_factory=dict)
    timeout: float = 120.0
    memory_mb: int = 256

    def reward(self, result: ExecResult) -> float:
        return 1.0 if result.exit_code == 0 and not result.timed_out else 0.0


async def outside(sb: AsyncSandbox, workspace: str) -> list[str]:
    """Every path of ``sb`` that is not ``workspace``, one of its parents, or under it."""
    parts = [p for p in workspace.strip("/").split("/") if p]
    out, parent = [], "/"
    for part in parts:
        keep = posixpath.join(parent, part)
        out += [e.path for e in await sb.files.list(parent) if e.path.rstrip("/") != keep]
        parent = keep
    return out


async def grade(agent: AsyncSandbox, grader: Grader, tag: str | None = None) -> ExecResult:
    """Pack the agent's workspace, grade it in a separate sandbox, stop that sandbox.

    The packed image is removed afterwards (its tag, and its layer once no sandbox uses
    it), unless the caller named ``tag`` to keep it."""
    made = tag is None
    tag = tag or f"grading/{agent.id}:{secrets.token_hex(4)}"
    await agent.pack_diff(tag, exclude=await outside(agent, grader.workspace))
    client = agent._client
    try:
        # The packed tag is a whole image: the agent's image and layers, then its workspace.
        judge = await client.create(image=tag,
                                    memory_mb=grader.memory_mb, network="none",
                                    labels={"role": "grader", "graded": agent.id})
        try:
            for path, data in grader.files.items():
                await judge.files.mkdir(posixpath.dirname(path))
                await judge.files.write(path, data, mode=0o755)
            return await judge.exec(grader.cmd, cwd=grader.workspace, timeout=grader.timeout)
        finally:
            await judge.stop()
    finally:
        if made:
            await client.remove_image(tag)
