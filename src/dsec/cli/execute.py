"""``dsec exec``: run one command in a sandbox, its output streamed as it is written."""

from __future__ import annotations

import asyncio
import sys
from typing import Annotated

import typer

import dsec
from dsec.api.models import ExecResult
from dsec.cli.common import JsonOpt, cli_errors, err, exit_status, fail, parse_pairs, print_json

__all__ = ["exec_"]


@cli_errors
def exec_(
    sandbox_id: Annotated[str, typer.Argument(metavar="ID", help="sandbox id")],
    cmd: Annotated[list[str], typer.Argument(metavar="-- CMD...",
                                             help="one argument runs under /bin/sh -c; "
                                                  "several run as an argv list")],
    timeout: Annotated[float, typer.Option(help="seconds before the command is killed")] = 600.0,
    workdir: Annotated[str | None, typer.Option("--workdir", "-w", help="working dir")] = None,
    env: Annotated[list[str] | None, typer.Option("--env", "-e", metavar="KEY=VALUE",
                                                  help="environment (repeatable)")] = None,
    user: Annotated[str | None, typer.Option("--user", "-u", help="user or uid[:gid]")] = None,
    stdin: Annotated[bool, typer.Option("--stdin", "-i", help="feed local stdin to the "
                                                                "command")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Run a command, streaming its output; exit with its exit code.

    With --json the output is not streamed: the whole result (exit code, stdout, stderr,
    duration, truncation) is printed as one JSON document when the command ends."""
    if cmd[0] == "--":  # interspersed args are off, so click hands the separator on
        cmd = cmd[1:]
    if not cmd:
        raise typer.BadParameter("give the command after the id: dsec exec ID -- CMD...")
    command: str | list[str] = cmd[0] if len(cmd) == 1 else cmd
    kwargs = dict(cwd=workdir, env=parse_pairs(env, "--env"), user=user, timeout=timeout,
                  stdin=sys.stdin.buffer.read() if stdin else None)
    if as_json:
        with dsec.Client() as client:
            result = client.get(sandbox_id).exec(command, **kwargs)
        print_json(result)
        raise typer.Exit(exit_status(result.exit_code) if not result.timed_out else 124)
    # asyncio.run turns Ctrl-C into a cancellation: the stream closes and the server
    # kills the command, instead of leaving it to run until its timeout.
    result = asyncio.run(_stream(sandbox_id, command, kwargs))
    if result.stdout_truncated or result.stderr_truncated:
        err.print("[yellow]warning:[/] output was truncated at the size cap")
    if result.timed_out:
        fail(f"command timed out after {timeout:g}s and was killed", code=124)
    if result.oom_killed:
        err.print("[red]error:[/] command was killed: out of memory")
    raise typer.Exit(exit_status(result.exit_code))


async def _stream(sandbox_id: str, command: str | list[str], kwargs: dict) -> ExecResult:
    result = None
    async with dsec.AsyncClient() as client:
        sb = await client.get(sandbox_id)
        async for ev in sb.exec_stream(command, **kwargs):  # read to the end: `exit` is last
            if ev.type == "exit":
                result = ev.result
                continue
            stream = sys.stdout if ev.type == "stdout" else sys.stderr
            stream.write(ev.data)
            stream.flush()
    if result is None:
        fail("the server ended the stream without an exit status")
    return result
