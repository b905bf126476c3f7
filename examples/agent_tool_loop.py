"""An agent loop over the tool adapter: a tool call in, text out, no RL framework.

``model`` stands in for an LLM: it looks at the transcript and returns the next tool call
in the usual {"name", "arguments"} shape. Halfway through, the loop "crashes"; a new loop
attaches to the same sandbox and re-issues the calls from the start: the logged ones are
answered from the trajectory log (nothing runs twice) and the rest run live.

    python examples/agent_tool_loop.py
"""

from __future__ import annotations

import json

import dsec
from dsec.rl import TOOLS, ToolAdapter

SCRIPT = [
    {"name": "write_file", "arguments": {"path": "/workspace/notes.txt", "content": "todo: count\n"}},
    {"name": "bash", "arguments": {"command": "echo run >> /workspace/runs; wc -l < /workspace/runs"}},
    {"name": "read_file", "arguments": json.dumps({"path": "/workspace/notes.txt"})},
    {"name": "bash", "arguments": {"command": "echo run >> /workspace/runs; wc -l < /workspace/runs"}},
]


def model(transcript: list[tuple[dict, str]]) -> dict | None:
    """The next tool call, or None when done (a real loop would ask an LLM with TOOLS)."""
    return SCRIPT[len(transcript)] if len(transcript) < len(SCRIPT) else None


def run(client: dsec.Client, sandbox_id: str, stop_after: int | None = None) -> list:
    tools = ToolAdapter(client.attach(sandbox_id))
    transcript: list[tuple[dict, str]] = []
    while (call := model(transcript)) is not None:
        if stop_after is not None and len(transcript) == stop_after:
            print("  ... the loop crashes here")
            break
        transcript.append((call, tools(call)))
        print(f"  {call['name']:10s} -> {transcript[-1][1].strip()!r}")
    return transcript


def main() -> None:
    print("tools offered to the model:", [t["name"] for t in TOOLS])
    with dsec.Client() as client:
        sb = client.create(memory_mb=64)
        try:
            sb.exec("mkdir -p /workspace")
            print("first loop:")
            run(client, sb.id, stop_after=3)
            print("restarted loop (first 3 calls come from the log):")
            run(client, sb.id)
            runs = sb.files.read("/workspace/runs").decode().count("run")
            print(f"the counting command ran {runs} times for 2 distinct calls")
        finally:
            sb.stop()


if __name__ == "__main__":
    main()
