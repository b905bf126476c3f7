"""``dsec serve``: run the embedded server (gateway and one node agent in one process)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from dsec.cli.common import err, server_needed

__all__ = ["serve", "node"]


def serve(
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 7070,
    state_dir: Annotated[Path | None, typer.Option(
        help="node state (SQLite, layers, token); default $DSEC_STATE_DIR or /var/lib/dsec")
    ] = None,
    backend: Annotated[list[str] | None, typer.Option(
        help="backend to enable (repeatable); default container")] = None,
    warm_pool: Annotated[list[str] | None, typer.Option(
        metavar="IMAGE=N", help="keep N started sandboxes of IMAGE ready (repeatable)")] = None,
    ray: Annotated[str | None, typer.Option(
        metavar="ADDRESS", help="be a gateway over a Ray cluster's nodes ('auto' ok)")] = None,
    node: Annotated[list[str] | None, typer.Option(
        "--node", metavar="URL", help="be a gateway over the node agent at URL (repeatable; "
                                      "`dsec node --listen` starts one)")] = None,
    images_remote: Annotated[str | None, typer.Option(
        metavar="URL", help="load layers on demand from this layer store")] = None,
    registry_pull: Annotated[bool, typer.Option(
        help="create(image='host/repo:tag') pulls an image the store lacks")] = False,
    insecure_registry: Annotated[list[str] | None, typer.Option(
        metavar="HOST", help="registry host:port reached over plain HTTP (loopback or "
                             "private; repeatable)")] = None,
    guest_accel: Annotated[str, typer.Option(
        help="microvm/vm accelerator: auto (KVM if a probe guest boots), kvm or tcg")] = "auto",
    guest_warm_start: Annotated[bool, typer.Option(
        help="start microvm sandboxes as clones of a booted template")] = False,
    guest_pause_to_disk: Annotated[bool, typer.Option(
        help="pausing a guest saves it to disk and ends its QEMU")] = False,
    trajectory_keep_s: Annotated[float | None, typer.Option(
        min=0, help="keep a stopped sandbox's trajectory log this many seconds "
                    "(default a day)")] = None,
    trajectory_max_mb: Annotated[float | None, typer.Option(
        min=0, help="prune stopped sandboxes' trajectory logs, oldest first, beyond "
                    "this size (default 1024)")] = None,
) -> None:
    """Run the dsec server on this machine until interrupted."""
    with server_needed("dsec serve"):  # the server stack loads only here
        from dsec.gateway.server import guest_options, registry_options, trajectory_options
        from dsec.gateway.server import serve as run_server
    if ray and node:
        raise typer.BadParameter("--ray and --node are two ways to find nodes; give one",
                                 param_hint="--node")
    if guest_accel not in ("auto", "kvm", "tcg"):
        raise typer.BadParameter("takes auto, kvm or tcg", param_hint="--guest-accel")

    if state_dir is not None:
        err.print(f"dsec: clients find this server through DSEC_STATE_DIR={state_dir.resolve()}"
                  " (or DSEC_URL and DSEC_TOKEN)")
    err.print("dsec: once it serves, try `dsec demo` from another terminal")
    try:
        run_server(state_dir, host=host, port=port, backends=backend,
                   warm_pool=_pool(warm_pool), ray_address=ray, images_remote=images_remote,
                   guests=guest_options(guest_accel, guest_warm_start, guest_pause_to_disk),
                   trajectory=trajectory_options(trajectory_keep_s, trajectory_max_mb),
                   registry=registry_options(registry_pull, insecure_registry),
                   node_urls=node or None)
    except KeyboardInterrupt:
        pass


def _pool(items: list[str] | None) -> dict[str, int]:
    pool: dict[str, int] = {}
    for item in items or []:
        image, _, n = item.rpartition("=")
        if not image or not n.isdigit():
            raise typer.BadParameter(f"takes IMAGE=N; got {item!r}", param_hint="--warm-pool")
        pool[image] = int(n)
    return pool


def node(
    ray: Annotated[str, typer.Option(metavar="ADDRESS",
                                     help="the Ray cluster to join ('auto' ok)")] = "auto",
    listen: Annotated[str | None, typer.Option(
        metavar="HOST:PORT", help="no Ray: serve this node's API at HOST:PORT in the "
                                  "foreground, for gateways started with --node URL")] = None,
    token: Annotated[str | None, typer.Option(
        "--cluster-token", "--token", envvar="DSEC_CLUSTER_TOKEN",
        help="the cluster credential the gateways hold (their state dir's cluster_token); "
             "not a user's token, which the node refuses")] = None,
    state_dir: Annotated[Path, typer.Option(help="this node's state directory")] = Path(
        "/var/lib/dsec"),
    backend: Annotated[list[str] | None, typer.Option(
        help="backend to enable (repeatable)")] = None,
) -> None:
    """Start this machine's node agent: in a Ray cluster (as a detached Ray actor), or with
    --listen in the foreground (Ctrl-C ends it; its sandboxes keep running)."""
    if not token:
        raise typer.BadParameter("the cluster credential is required (or "
                                 "DSEC_CLUSTER_TOKEN): the gateway state dir's cluster_token",
                                 param_hint="--cluster-token")
    backends = [x for b in backend or [] for x in ("--backend", b)]
    if listen is not None:
        host, _, port = listen.rpartition(":")
        if not host or not port.isdigit():
            raise typer.BadParameter(f"takes HOST:PORT; got {listen!r}", param_hint="--listen")
        with server_needed("dsec node"):
            from dsec.cluster.agent import main as agent_main
        os.environ["DSEC_CLUSTER_TOKEN"] = token  # not on the command line: ps shows that
        agent_main(["--host", host, "--port", port, "--state-dir", str(state_dir), *backends])
        return
    with server_needed("dsec node", extra="ray"):
        from dsec.cluster.ray import main as node_main
    node_main(["--address", ray, "--state-dir", str(state_dir), "--token", token, *backends])
