"""The ``dsec`` command: a thin layer over the SDK (and the pty WebSocket for ``shell``).

The server address and token come from DSEC_URL and DSEC_TOKEN, else from the local
server's state directory ($DSEC_STATE_DIR, default /var/lib/dsec), as for the SDK.
"""

from __future__ import annotations

from typing import Annotated

import typer

import dsec

from dsec.cli.demo import demo
from dsec.cli.execute import exec_
from dsec.cli.files import cp
from dsec.cli.image import image_app
from dsec.cli.images import images, nodes
from dsec.cli.project import project_app
from dsec.cli.sandboxes import create, ls, rm
from dsec.cli.serve import node, serve
from dsec.cli.trajectory import trajectory_app
from dsec.cli.shell import shell

__all__ = ["app"]

# add_completion: `dsec --install-completion` (bash, zsh, fish, PowerShell) and
# `dsec --show-completion` to print the script instead.
app = typer.Typer(name="dsec", no_args_is_help=True, add_completion=True,
                  pretty_exceptions_show_locals=False,
                  help="Elastic sandboxes for agentic RL: run `dsec serve`, then `dsec demo`.")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"dsec {dsec.__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True,
        help="print the version and exit")] = False) -> None:
    """Elastic sandboxes for agentic RL: run `dsec serve`, then `dsec demo`."""

app.command()(serve)
app.command()(node)
app.command()(create)
app.command()(ls)
# Everything after the id belongs to the command, so `dsec exec ID ls -la` needs no `--`.
app.command("exec", context_settings={"allow_interspersed_args": False})(exec_)
app.command()(shell)
app.command()(cp)
app.command()(rm)
app.command()(images)
app.command()(nodes)
app.command()(demo)
app.add_typer(image_app)
app.add_typer(trajectory_app)
app.add_typer(project_app)
