"""``dsec images`` and ``dsec nodes``: what the server has."""

from __future__ import annotations

import time

from rich.table import Table

import dsec
from dsec.cli.common import JsonOpt, age, cli_errors, err, mib, out, print_json

__all__ = ["images", "nodes", "image_table"]


@cli_errors
def images(as_json: JsonOpt = False) -> None:
    """List the images (tags) the server knows."""
    with dsec.Client() as client:
        found = client.images()
    if as_json:
        print_json(sorted(found, key=lambda im: im.name))
        return
    if not found:
        err.print("no images")
        return
    out.print(image_table([(im.name, im.digest, im.layers, im.size, im.created)
                           for im in found]))


def image_table(rows: list[tuple[str, str, int, int, float | None]]) -> Table:
    """The table of ``dsec images`` from (name, digest, layers, size, created) rows."""
    table = Table(box=None, header_style="bold")
    table.add_column("NAME", no_wrap=True)
    table.add_column("DIGEST", no_wrap=True)
    table.add_column("LAYERS", justify="right")
    table.add_column("SIZE", justify="right")
    table.add_column("AGE", justify="right")
    now = time.time()
    for name, digest, layers, size, created in sorted(rows, key=lambda r: r[0]):
        table.add_row(name, digest.split(":", 1)[-1][:12], str(layers), mib(size),
                      age(created, now))
    return table


@cli_errors
def nodes(as_json: JsonOpt = False) -> None:
    """List the cluster's nodes and their load."""
    with dsec.Client() as client:
        found = client.nodes()
    if as_json:
        print_json(found)
        return
    table = Table(box=None, header_style="bold")
    table.add_column("ID", no_wrap=True)
    table.add_column("HEALTH")
    table.add_column("BACKENDS")
    table.add_column("CPUS", justify="right")
    table.add_column("MEMORY", justify="right")
    table.add_column("SANDBOXES", justify="right")
    table.add_column("RUNNING", justify="right")
    for col in ("RESERVED", "AVAILABLE", "RECLAIMED", "SWAP FREE", "CPU USED", "PRESSURE"):
        table.add_column(col, justify="right")
    for n in found:
        table.add_row(n.id, "ok" if n.healthy else "[red]lost[/red]", ",".join(n.backends),
                      str(n.cpus), f"{n.memory_mb} MiB", str(n.sandboxes), _or(n.running, "{}"),
                      _or(n.memory_reserved_mb, "{} MiB") + " / " + _or(n.cpu_reserved, "{:g}"),
                      _or(n.memory_available_mb, "{} MiB"),
                      _or(n.memory_reclaimed_mb, "{:.0f} MiB"),
                      _or(n.swap_free_mb, "{} MiB") + " of " + _or(n.swap_mb, "{} MiB"),
                      _or(n.cpu_used, "{:.1f}"),
                      "mem " + _or(n.memory_pressure, "{:.1f}%") + " cpu "
                      + _or(n.cpu_pressure, "{:.1f}%"))
    out.print(table)
    for n in found:  # notes, on stderr: stdout stays the table
        if not n.healthy:
            err.print(f"{n.id}: lost: {n.problem} (figures from its last answer)")
        if n.core_scheduling or n.ksm:
            err.print(f"{n.id}: {n.core_scheduling or ''}; KSM: {n.ksm or 'unknown'}")


def _or(value, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)
