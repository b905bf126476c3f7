"""A gymnasium-style environment over a sandbox, with no gymnasium dependency.

``reset()`` creates a sandbox from an image and layers (and writes the task's files);
``step(action)`` runs one tool call and returns ``(observation, reward, terminated,
truncated, info)``; ``close()`` stops the sandbox. The episode ends when the agent calls
the ``submit`` tool or after ``max_steps``; then the grader runs in a separate sandbox
(:mod:`dsec.rl.grading`) and its verdict is the reward.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import Any

from dsec.rl.grading import Grader, grade
from dsec.rl.tools import AsyncToolAdapter
from dsec.sdk.client import AsyncClient
from dsec.sdk.sandbox import AsyncSandbox

__all__ = ["Task", "AsyncSandboxEnv", "SandboxEnv"]


@dataclass
class Task:
    """What an episode starts from and how it is judged."""

    prompt: str
    grader: Grader
    image: str = "busybox"
    layers: list[str] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)  # written before the first step
    setup: str | None = None                                # run before the first step


class AsyncSandboxEnv:
    """One episode at a time in one sandbox; run many envs side by side for parallelism."""

    def __init__(self, client: AsyncClient, task: Task, *, max_steps: int = 30,
                 memory_mb: int = 256, job: str | None = None,
                 tool_timeout: float = 60.0) -> None:
        self.client, self.task, self.max_steps = client, task, max_steps
        self.memory_mb, self.job, self.tool_timeout = memory_mb, job, tool_timeout
        self.sandbox: AsyncSandbox | None = None
        self.tools: AsyncToolAdapter | None = None
        self.steps = 0

    async def reset(self, *, seed: int | None = None, sandbox_id: str | None = None,
                    options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode in a new sandbox, or re-attach to ``sandbox_id`` (after a crash
        the trainer re-issues its actions; logged ones are answered from the log)."""
        if sandbox_id is not None:
            self.sandbox = await self.client.attach(sandbox_id)
        else:
            await self._stop()
            self.sandbox = await self.client.create(
                image=self.task.image, layers=self.task.layers, memory_mb=self.memory_mb,
                job=self.job, labels={"role": "agent"})
            for path, data in self.task.files.items():
                await self.sandbox.files.mkdir(posixpath.dirname(path))
                await self.sandbox.files.write(path, data)
            if self.task.setup:
                await self.sandbox.exec(self.task.setup, step="setup")
        self.tools = AsyncToolAdapter(self.sandbox, self.tool_timeout)
        self.steps = 0
        return self.task.prompt, {"sandbox_id": self.sandbox.id}

    async def step(self, action: str | dict[str, Any]
                   ) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Run one tool call (a string is a bash command; ``{"name": "submit"}`` ends)."""
        if self.sandbox is None or self.tools is None:
            raise RuntimeError("call reset() before step()")
        call = {"name": "bash", "arguments": {"command": action}} \
            if isinstance(action, str) else action
        self.steps += 1
        if (call.get("name") or call.get("tool")) == "submit":
            return await self._finish(terminated=True)
        obs = await self.tools(call)
        if self.steps >= self.max_steps:
            _, reward, _, _, info = await self._finish(terminated=False)
            return obs, reward, False, True, info
        return obs, 0.0, False, False, {}

    async def _finish(self, terminated: bool) -> tuple[str, float, bool, bool, dict[str, Any]]:
        result = await grade(self.sandbox, self.task.grader)
        reward = self.task.grader.reward(result)
        return "graded", reward, terminated, not terminated, {"grade": result}

    async def close(self) -> None:
        await self._stop()

    async def _stop(self) -> None:
        if self.sandbox is not None:
            try:
                await self.sandbox.stop()
            except Exception:  # already gone (stopped with its job, expired)
                pass
            self.sandbox = None


class SandboxEnv:
    """The blocking face of :class:`AsyncSandboxEnv`, over a ``dsec.Client``."""

    def __init__(self, client, task: Task, **kwargs: Any) -> None:
        self._async = AsyncSandboxEnv(client._async, task, **kwargs)

    def reset(self, **kwargs: Any) -> tuple[str, dict[str, Any]]:
        from dsec.sdk.sync import _run
        return _run(self._async.reset(**kwargs))

    def step(self, action: str | dict[str, Any]) -> tuple[str, float, bool, bool, dict[str, Any]]:
        from dsec.sdk.sync import _run
        return _run(self._async.step(action))

    def close(self) -> None:
        from dsec.sdk.sync import _run
        _run(self._async.close())
