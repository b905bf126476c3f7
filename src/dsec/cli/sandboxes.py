"""``dsec create``, ``dsec ls`` and ``dsec rm``."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

import dsec
from dsec.api.errors import DSecError
from dsec.api.models import SandboxInfo
from dsec.cli.common import JsonOpt, age, cli_errors, err, fail, out, parse_pairs, print_json

__all__ = ["create", "ls", "rm", "sandbox_table"]

CREATE_CONCURRENCY = 16
STATE_STYLE = {"running": "green", "paused": "yellow", "starting": "cyan", "failed": "red",
               "stopped": "dim"}

Labels = Annotated[list[str] | None, typer.Option("--label", "-l", metavar="KEY=VALUE",
                                                  help="label (repeatable)")]


@cli_errors
def create(
    image: Annotated[str, typer.Option(help="image name or tag")] = "busybox",
    backend: Annotated[str, typer.Option(help="container, microvm, vm or fncall")] = "container",
    cpu: Annotated[float, typer.Option(help="CPU cores")] = 1.0,
    memory_mb: Annotated[int, typer.Option(help="memory limit in MiB")] = 512,
    disk_mb: Annotated[int, typer.Option(help="writable layer limit in MiB")] = 1024,
    ttl: Annotated[float, typer.Option(help="maximum life in seconds; 0 for none")] = 3600.0,
    idle_ttl: Annotated[float, typer.Option(help="stop after this many idle seconds; 0 for "
                                                 "never")] = 0.0,
    job: Annotated[str | None, typer.Option(help="job the sandbox belongs to")] = None,
    label: Labels = None,
    count: Annotated[int, typer.Option("--count", "-n", min=1, help="how many")] = 1,
    as_json: JsonOpt = False,
) -> None:
    """Create sandboxes and print their ids, one per line (--json: their full records)."""
    kwargs = dict(backend=backend, image=image, cpu=cpu, memory_mb=memory_mb, disk_mb=disk_mb,
                  ttl_s=ttl or None, idle_ttl_s=idle_ttl or None, job=job,
                  labels=parse_pairs(label, "--label"))
    t0 = time.perf_counter()
    made, errors = asyncio.run(_create_concurrently(count, kwargs))
    if as_json:
        print_json(made)
    else:
        for info in made:
            out.print(info.id)
    if errors:
        if not made:
            raise errors[0]
        for message in sorted({e.message for e in errors}):
            err.print(f"[red]error:[/] {message}")
        fail(f"{len(errors)} of {count} sandboxes could not be created")
    if count > 1:
        err.print(f"created {len(made)} sandboxes in {time.perf_counter() - t0:.2f}s")


async def _create_concurrently(count: int, kwargs: dict
                               ) -> tuple[list[SandboxInfo], list[DSecError]]:
    """Create ``count`` sandboxes, a few requests at a time, with a bar on stderr."""
    made: list[SandboxInfo] = []
    errors: list[DSecError] = []
    gate = asyncio.Semaphore(CREATE_CONCURRENCY)
    async with dsec.AsyncClient() as client:
        async def one() -> SandboxInfo:
            async with gate:
                return (await client.create(**kwargs)).info

        progress = Progress(TextColumn("creating"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=err, transient=True,
                            disable=count == 1)
        with progress:
            bar = progress.add_task("create", total=count)
            for fut in asyncio.as_completed([one() for _ in range(count)]):
                try:
                    made.append(await fut)
                except DSecError as exc:
                    errors.append(exc)
                progress.advance(bar)
    return made, errors


@cli_errors
def ls(
    job: Annotated[str | None, typer.Option(help="only this job's sandboxes")] = None,
    label: Labels = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="print ids only")] = False,
    as_json: JsonOpt = False,
) -> None:
    """List sandboxes."""
    with dsec.Client() as client:
        infos = client.list(job=job, labels=parse_pairs(label, "--label"))
    _warn_unreachable(infos.unreachable, "listed")
    if as_json:
        print_json(sorted(infos, key=lambda i: i.created_at))
        return
    if quiet:
        for info in infos:
            out.print(info.id)
        return
    if not infos:
        err.print("no sandboxes")
        return
    out.print(sandbox_table(infos))


def sandbox_table(infos: list[SandboxInfo]) -> Table:
    table = Table(box=None, header_style="bold")
    table.add_column("ID", no_wrap=True)
    for name in ("BACKEND", "IMAGE", "STATE"):
        table.add_column(name)
    table.add_column("CPU", justify="right")
    table.add_column("MEMORY", justify="right")
    table.add_column("JOB")
    table.add_column("AGE", justify="right")
    now = time.time()
    for i in sorted(infos, key=lambda i: i.created_at):
        state = f"[{STATE_STYLE.get(i.state, '')}]{i.state}[/]"
        table.add_row(i.id, i.backend, i.image, state, f"{i.cpu:g}", f"{i.memory_mb} MiB",
                      i.job or "-", age(i.created_at, now))
    return table


@cli_errors
def rm(
    ids: Annotated[list[str] | None, typer.Argument(metavar="[ID]...", help="sandbox ids")] = None,
    all_: Annotated[bool, typer.Option("--all", help="stop every sandbox this token sees "
                                                  "(asks first, unless --yes)")] = False,
    job: Annotated[str | None, typer.Option(help="stop every sandbox of this job")] = None,
    as_json: JsonOpt = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask before --all")] = False,
) -> None:
    """Stop sandboxes and remove everything they had."""
    if not ids and not all_ and job is None:
        raise typer.BadParameter("give sandbox ids, --job JOB or --all")
    if ids and (all_ or job is not None):
        raise typer.BadParameter("give either sandbox ids or --all/--job, not both")
    if all_ and job is None:
        n = _stop_everything(yes)
        if as_json:
            print_json({"stopped": n})
        return
    if not ids:
        with dsec.Client() as client:
            n = client.stop_all(job=job)
        if as_json:
            print_json({"stopped": n})
        err.print(f"stopped {n} sandbox{'es' if n != 1 else ''}")
        return
    failures = asyncio.run(_stop_ids(ids, quiet=as_json))
    if as_json:
        failed = dict(failures)
        print_json([{"id": i, "stopped": i not in failed}
                    | ({"error": failed[i].to_wire()["error"]} if i in failed else {})
                    for i in ids])
    if len(ids) == 1 and failures:
        fail(failures[0][1].message)
    for sb_id, exc in failures:
        err.print(f"[red]error:[/] {sb_id}: {exc.message}")
    if failures:
        fail(f"{len(failures)} of {len(ids)} sandboxes could not be stopped")


def _warn_unreachable(nodes: list[str], what: str) -> None:
    """Nodes that did not answer: their sandboxes are not in what this command did."""
    if nodes:
        err.print(f"[yellow]warning:[/] node(s) {', '.join(nodes)} did not answer: their "
                  f"sandboxes are not {what} (see `dsec nodes`)")


def _plural(n: int) -> str:
    return f"{n} sandbox{'es' if n != 1 else ''}"


def _stop_everything(yes: bool) -> int:
    """``rm --all``: say how many, and ask (or need --yes) before stopping them."""
    with dsec.Client() as client:
        infos = client.list()
    _warn_unreachable(infos.unreachable, "stopped")
    if not infos:
        err.print("no sandboxes to stop")
        return 0
    projects = sorted({i.project or 'the root project' for i in infos})
    what = f"{_plural(len(infos))} ({', '.join(projects)})"
    if not yes:
        if not sys.stdin.isatty():
            fail(f"--all would stop {what}; add --yes to confirm")
        if not typer.confirm(f"stop {what}?", default=False, err=True):
            fail("nothing stopped")
    failures = asyncio.run(_stop_ids([i.id for i in infos], quiet=True))
    for sb_id, exc in failures:
        if not isinstance(exc, dsec.NotFound):  # gone meanwhile is what was asked
            err.print(f"[red]error:[/] {sb_id}: {exc.message}")
    err.print(f"stopped {_plural(len(infos) - len(failures))}")
    return len(infos) - len(failures)


async def _stop_ids(ids: list[str], quiet: bool = False) -> list[tuple[str, DSecError]]:
    async with dsec.AsyncClient() as client:
        async def one(sb_id: str) -> None:
            await (await client.get(sb_id)).stop()
            if not quiet:
                out.print(sb_id)

        results = await asyncio.gather(*(one(i) for i in ids), return_exceptions=True)
    failures = []
    for sb_id, res in zip(ids, results):
        if isinstance(res, DSecError):
            failures.append((sb_id, res))
        elif isinstance(res, BaseException):
            raise res
    return failures
