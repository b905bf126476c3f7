"""An agent-loop tool adapter: a tool call in, text out. No RL framework needed.

``TOOLS`` describes the tools in the JSON-schema shape most LLM APIs take; an
:class:`AsyncToolAdapter` runs a call in a sandbox and returns what the model should see.
Calls carry step keys (``t0``, ``t1``, ...), so a loop restarted after a crash re-issues
its calls and gets the logged answers instead of running them twice.
"""

from __future__ import annotations

import json
from typing import Any

from dsec.api.errors import DSecError
from dsec.api.models import ExecResult
from dsec.sdk.sandbox import AsyncSandbox

__all__ = ["TOOLS", "AsyncToolAdapter", "ToolAdapter", "format_result"]

TOOLS: list[dict[str, Any]] = [
    {"name": "bash", "description": "Run a shell command in the sandbox.",
     "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                    "required": ["command"]}},
    {"name": "read_file", "description": "Read a text file.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                    "required": ["path"]}},
    {"name": "write_file", "description": "Create or replace a text file.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"},
                                                     "content": {"type": "string"}},
                    "required": ["path", "content"]}},
]


def format_result(r: ExecResult, limit: int = 8000) -> str:
    """What a model sees of a command: the exit status and the (clipped) output."""
    text = r.stdout + (f"\n[stderr]\n{r.stderr}" if r.stderr else "")
    if len(text) > limit:
        text = text[:limit] + f"\n[... {len(text) - limit} more characters]"
    status = "timed out" if r.timed_out else f"exit {r.exit_code}"
    return f"[{status}]\n{text}"


def _parse(call: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Accept {'name', 'arguments'} (arguments as dict or JSON text) or {'tool', ...}."""
    if "function" in call:
        call = call["function"]
    name = call.get("name") or call.get("tool")
    args = call.get("arguments", {k: v for k, v in call.items() if k not in ("name", "tool")})
    if isinstance(args, str):
        args = json.loads(args or "{}")
    return str(name), dict(args)


class AsyncToolAdapter:
    """Runs tool calls in one sandbox; ``await adapter(call) -> str``."""

    def __init__(self, sandbox: AsyncSandbox, timeout: float = 60.0, prefix: str = "") -> None:
        self.sandbox = sandbox
        self.timeout = timeout
        self.prefix = prefix
        self.calls = 0

    def _step(self) -> str:
        key = f"{self.prefix}t{self.calls}"
        self.calls += 1
        return key

    async def __call__(self, call: dict[str, Any]) -> str:
        name, args = _parse(call)
        try:
            if name == "bash":
                r = await self.sandbox.exec(args["command"], timeout=self.timeout,
                                            step=self._step())
                return format_result(r)
            if self.sandbox.info.protected_paths and name in ("read_file", "write_file"):
                return await self._confined_file(name, args)
            if name == "read_file":
                return (await self.sandbox.files.read(args["path"])).decode(errors="replace")
            if name == "write_file":
                self._step()  # file writes are logged, not keyed; keep positions aligned
                await self.sandbox.files.write(args["path"], args["content"])
                return f"wrote {len(args['content'])} characters to {args['path']}"
        except KeyError as exc:
            return f"[error] tool {name} needs argument {exc}"
        except DSecError as exc:
            return f"[error] {type(exc).__name__}: {exc.message}"
        return f"[error] unknown tool {name!r}; tools: {[t['name'] for t in TOOLS]}"


    async def _confined_file(self, name: str, args: dict[str, Any]) -> str:
        """A file tool as a command in the sandbox: the files API reaches protected paths
        when the caller's token may grade (a trainer's admin token); the model's reads and
        writes must not."""
        path = args["path"]
        if name == "read_file":
            r = await self.sandbox.exec(["cat", "--", path], timeout=self.timeout)
            return r.stdout if r.exit_code == 0 else f"[error] {r.stderr.strip()}"
        r = await self.sandbox.exec(["sh", "-c", 'cat > "$1"', "sh", path],
                                    stdin=args["content"], timeout=self.timeout,
                                    step=self._step())
        if r.exit_code != 0:
            return f"[error] {r.stderr.strip()}"
        return f"wrote {len(args['content'])} characters to {path}"


class ToolAdapter:
    """The blocking twin of :class:`AsyncToolAdapter`, over a ``dsec.Sandbox``."""

    def __init__(self, sandbox, timeout: float = 60.0, prefix: str = "") -> None:
        self._async = AsyncToolAdapter(sandbox._async, timeout, prefix)

    def __call__(self, call: dict[str, Any]) -> str:
        from dsec.sdk.sync import _run
        return _run(self._async(call))
