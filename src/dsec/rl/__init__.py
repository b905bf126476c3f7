"""The glue an RL loop wants: a sandbox environment, a tool adapter, hidden grading."""

from dsec.rl.env import AsyncSandboxEnv, SandboxEnv, Task
from dsec.rl.grading import Grader, grade
from dsec.rl.tools import TOOLS, AsyncToolAdapter, ToolAdapter

__all__ = ["AsyncSandboxEnv", "SandboxEnv", "Task", "Grader", "grade", "TOOLS",
           "AsyncToolAdapter", "ToolAdapter"]
