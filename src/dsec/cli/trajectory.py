"""``dsec trajectory show ID`` and ``dsec trajectory audit ID``.

Mounted by the main CLI with ``app.add_typer(trajectory_app)``.
"""

from __future__ import annotations

import json
import time
from typing import Annotated

import typer
from rich.table import Table

import dsec
from dsec.api.rl import TrajectoryEntry, TrajectoryPage
from dsec.cli.common import JsonOpt, cli_errors, out, print_json

__all__ = ["trajectory_app", "entry_row"]

trajectory_app = typer.Typer(name="trajectory", no_args_is_help=True, add_completion=False,
                             help="A sandbox's log of mutating calls, and its denied actions.")

SandboxId = Annotated[str, typer.Argument(help="sandbox id (sb-...)")]


def _what(e: TrajectoryEntry) -> str:
    r = e.request
    if e.kind in ("exec", "shell_run"):
        cmd = r.get("cmd")
        return cmd if isinstance(cmd, str) else " ".join(cmd or [])
    if e.kind == "file_write":
        return f"{r.get('path')} ({r.get('size')} bytes)"
    return str(r.get("tag", ""))


def entry_row(e: TrajectoryEntry) -> list[str]:
    """The table row of one entry: seq, step, kind, what, exit, ms, when."""
    code = e.result.get("exit_code")
    ms = e.result.get("duration_ms")
    when = time.strftime("%H:%M:%S", time.localtime(e.at))
    what = " ".join(_what(e).split())
    return [str(e.seq), e.step or "", e.kind, what[:80] + ("…" if len(what) > 80 else ""),
            "" if code is None else str(code), "" if ms is None else f"{ms:.0f}", when]


@trajectory_app.command("show")
@cli_errors
def show(sandbox_id: SandboxId,
         as_json: Annotated[bool, typer.Option("--json", help="one JSON entry per line, "
                                                             "results included")] = False,
         offset: Annotated[int, typer.Option(min=0, help="first position to show")] = 0,
         limit: Annotated[int, typer.Option(min=1, help="entries to show")] = 1000) -> None:
    """Print a sandbox's trajectory: every exec, shell run, file write and pack_diff."""
    with dsec.Client() as client:
        page = _page(client, sandbox_id, offset, limit)
    if as_json:
        for e in page.entries:
            out.print(json.dumps(e.model_dump()), markup=False)
        return
    t = Table("seq", "step", "kind", "what", "exit", "ms", "at", box=None, pad_edge=False)
    for e in page.entries:
        t.add_row(*entry_row(e))
    out.print(t)
    out.print(f"{len(page.entries)} of {page.total} entries")


def _page(client: dsec.Client, sandbox_id: str, offset: int, limit: int) -> TrajectoryPage:
    # By id alone, not client.get(): a stopped sandbox is gone but its log remains.
    from dsec.sdk.sync import _run
    resp = _run(client._async._request("GET", f"/v1/sandboxes/{sandbox_id}/trajectory",
                                       params={"offset": offset, "limit": limit}))
    return TrajectoryPage.model_validate(resp.json())


@trajectory_app.command("audit")
@cli_errors
def audit(sandbox_id: SandboxId, as_json: JsonOpt = False) -> None:
    """Print the actions a sandbox was refused (network destinations, divergent replays)."""
    with dsec.Client() as client:
        records = client.get(sandbox_id).audit()
    if as_json:
        print_json(records)
        return
    t = Table("kind", "detail", "count", box=None, pad_edge=False)
    for r in records:
        t.add_row(r.kind, r.detail, str(r.count))
    out.print(t)
