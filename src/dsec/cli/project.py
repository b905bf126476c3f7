"""``dsec project ...``: sub-projects, quotas, tokens and the audit log.

Mounted by the main CLI with ``app.add_typer(project_app)``. Project paths look like
``team/run-17``; ``""`` (the default where a path is optional) is the token's own view.
"""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.table import Table

import dsec
from dsec.api.projects import ProjectInfo
from dsec.cli.common import JsonOpt, age, cli_errors, err, out, print_json

__all__ = ["project_app"]

project_app = typer.Typer(name="project", no_args_is_help=True, add_completion=False,
                          help="Projects: quotas, tokens and the audit log.")

Path = Annotated[str, typer.Argument(help="project path, e.g. team/run-17")]
Sandboxes = Annotated[int | None, typer.Option(help="sandboxes at once")]
Cpu = Annotated[float | None, typer.Option(help="CPU cores at once")]
Memory = Annotated[int | None, typer.Option("--memory-mb", help="MiB of memory at once")]
Rate = Annotated[float | None, typer.Option("--creations-per-s", help="creations per second")]


def _quota(sandboxes, cpu, memory_mb, rate) -> dsec.Quota:
    from dsec.api.models import validated
    return validated(dsec.Quota, sandboxes=sandboxes, cpu=cpu, memory_mb=memory_mb,
                     creations_per_s=rate)


def _limit(value, used=None) -> str:
    top = "-" if value is None else f"{value:g}"
    return top if used is None else f"{used:g}/{top}"


@project_app.command("create")
@cli_errors
def create(path: Path, sandboxes: Sandboxes = None, cpu: Cpu = None, memory_mb: Memory = None,
           creations_per_s: Rate = None, as_json: JsonOpt = False) -> None:
    """Create a sub-project, with a quota out of what its parent has left."""
    with dsec.Client() as c:
        info = c.projects.create(path, quota=_quota(sandboxes, cpu, memory_mb, creations_per_s))
    if as_json:
        return print_json(info)
    out.print(info.id)


@project_app.command("quota")
@cli_errors
def quota(path: Path, sandboxes: Sandboxes = None, cpu: Cpu = None, memory_mb: Memory = None,
          creations_per_s: Rate = None, as_json: JsonOpt = False) -> None:
    """Set a sub-project's quota (unset fields: no limit of its own)."""
    q = _quota(sandboxes, cpu, memory_mb, creations_per_s)
    with dsec.Client() as c:
        c.projects.set_quota(path, q)
    if as_json:
        print_json({"project": path, "quota": q})


@project_app.command("ls")
@cli_errors
def ls(as_json: JsonOpt = False) -> None:
    """This token's project and those below it, with usage against quota."""
    with dsec.Client() as c:
        infos = c.projects.list()
    if as_json:
        return print_json(infos)
    out.print(_table(infos))


def _table(infos: list[ProjectInfo]) -> Table:
    table = Table(box=None, header_style="bold")
    for name in ("PROJECT", "SANDBOXES", "CPU", "MEMORY_MB", "CREATIONS/S", "AGE"):
        table.add_column(name)
    now = time.time()
    for i in infos:
        q, u = i.quota, i.usage
        table.add_row(i.path or "(root)", _limit(q.sandboxes, u.sandboxes), _limit(q.cpu, u.cpu),
                      _limit(q.memory_mb, u.memory_mb), _limit(q.creations_per_s),
                      age(i.created_at, now))
    return table


@project_app.command("usage")
@cli_errors
def usage(path: Path, as_json: JsonOpt = False) -> None:
    """What the project and all below it hold now."""
    with dsec.Client() as c:
        u = c.projects.usage(path)
    if as_json:
        return print_json(u)
    out.print(f"sandboxes {u.sandboxes}  cpu {u.cpu:g}  memory_mb {u.memory_mb}")


@project_app.command("rm")
@cli_errors
def rm(path: Path, as_json: JsonOpt = False) -> None:
    """Delete an empty project (no sub-projects, sandboxes, job leases or snapshots); its
    tokens stop working."""
    with dsec.Client() as c:
        c.projects.delete(path)
    if as_json:
        print_json({"project": path, "deleted": True})


@project_app.command("token")
@cli_errors
def token(path: Path,
          role: Annotated[str, typer.Option(help="admin, grader, user or viewer")] = "user",
          ttl: Annotated[float, typer.Option(
              help="seconds until it expires, at most until this CLI's token does; 0: "
                   "never, or when this CLI's token expires if it does")] = 86400,
          name: Annotated[str, typer.Option(help="a note saying whose it is")] = "",
          as_json: JsonOpt = False) -> None:
    """Create a token of the project and print its secret (shown this once)."""
    with dsec.Client() as c:
        made = c.projects.create_token_info(path, role=role, ttl_s=ttl or None, name=name)
    if as_json:
        return print_json(made)
    err.print(f"token {made.id} ({made.role} of {made.project or '(root)'}); keep the secret, "
              "it is not shown again")
    out.print(made.token)


@project_app.command("tokens")
@cli_errors
def tokens(path: Path, as_json: JsonOpt = False) -> None:
    """The project's tokens (ids, roles, expiry; never the secrets)."""
    with dsec.Client() as c:
        infos = c.projects.tokens(path)
    if as_json:
        return print_json(infos)
    table = Table(box=None, header_style="bold")
    for col in ("ID", "ROLE", "NAME", "EXPIRES", "REVOKED", "MINTED BY"):
        table.add_column(col)
    for t in infos:
        expires = "-" if t.expires_at is None else time.strftime(
            "%Y-%m-%d %H:%M", time.gmtime(t.expires_at))
        table.add_row(t.id, t.role, t.name or "-", expires, "yes" if t.revoked_at else "-",
                      t.created_by or "-")
    out.print(table)


@project_app.command("revoke")
@cli_errors
def revoke(token_: Annotated[str, typer.Argument(metavar="TOKEN", help="tok-... or the secret")],
           as_json: JsonOpt = False) -> None:
    """Revoke a token at once (its open streams end)."""
    with dsec.Client() as c:
        c.projects.revoke_token(token_)
    if as_json:
        print_json({"revoked": True})


@project_app.command("audit")
@cli_errors
def audit(path: Annotated[str, typer.Argument(help="project path; default: the token's")] = "",
          limit: Annotated[int, typer.Option(help="entries, newest first")] = 50,
          as_json: JsonOpt = False) -> None:
    """Management calls and refused requests of the project and below."""
    with dsec.Client() as c:
        if not path:
            path = c.projects.list()[0].path
        entries = c.projects.audit(path, limit=limit)
    if as_json:
        return print_json(entries)
    table = Table(box=None, header_style="bold")
    for col in ("WHEN", "PROJECT", "WHO", "ACTION", "TARGET", "OUTCOME"):
        table.add_column(col)
    for e in entries:
        table.add_row(time.strftime("%H:%M:%S", time.gmtime(e.at)), e.project or "(root)",
                      e.who, e.action, e.target or "-", e.outcome)
    out.print(table)
