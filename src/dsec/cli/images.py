"""``dsec images`` and ``dsec nodes``: what the server has."""

from __future__ import annotations

from rich.table import Table

import dsec
from dsec.cli.common import age, cli_errors, err, mib, out

__all__ = ["images", "nodes"]


@cli_errors
def images() -> None:
    """List the images (tags) the server knows."""
    with dsec.Client() as client:
        found = client.images()
    if not found:
        err.print("no images")
        return
    table = Table(box=None, header_style="bold")
    table.add_column("NAME", no_wrap=True)
    table.add_column("DIGEST", no_wrap=True)
    table.add_column("LAYERS", justify="right")
    table.add_column("SIZE", justify="right")
    table.add_column("AGE", justify="right")
    for im in sorted(found, key=lambda i: i.name):
        digest = im.digest.split(":", 1)[-1][:12]
        table.add_row(im.name, digest, str(im.layers), mib(im.size), age(im.created))
    out.print(table)


@cli_errors
def nodes() -> None:
    """List the cluster's nodes and their load."""
    with dsec.Client() as client:
        found = client.nodes()
    table = Table(box=None, header_style="bold")
    table.add_column("ID", no_wrap=True)
    table.add_column("BACKENDS")
    table.add_column("CPUS", justify="right")
    table.add_column("MEMORY", justify="right")
    table.add_column("SANDBOXES", justify="right")
    table.add_column("RUNNING", justify="right")
    for n in found:
        table.add_row(n.id, ",".join(n.backends), str(n.cpus), f"{n.memory_mb} MiB",
                      str(n.sandboxes), str(n.running))
    out.print(table)
