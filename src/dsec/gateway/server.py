"""``dsec serve``: the embedded server (gateway + one node agent in one process)."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from pathlib import Path

import structlog
import uvicorn

from dsec.cluster.local import LocalCluster
from dsec.gateway import logs
from dsec.gateway.app import create_app
from dsec.gateway.auth import load_or_create_token
from dsec.gateway.coalesce import CoalescingProtocol
from dsec.gateway.projects import Projects
from dsec.node.config import NodeConfig

__all__ = ["serve", "secure_state_dir", "run_loop", "DEFAULT_PORT"]

DEFAULT_PORT = 7070
GC_YOUNG = 10_000  # allocations between young collections (CPython's default is 700)
log = logging.getLogger("dsec.gateway")
slog = structlog.get_logger("dsec.gateway")


def settle_heap() -> None:
    """Once the app is built: what exists now (modules, the app, its models and schemas,
    the node's records) is moved out of the collector's generations, and the young
    generation is collected less often. Without it the cyclic collector was about 9 % of
    the server's CPU per exec under load (perf): each older-generation pass walked every
    object the server has ever kept. Cycles are still collected; only less often and
    over what was made since."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG, older, oldest)


async def _serve(config: NodeConfig, host: str, port: int, on_ready=None) -> None:
    token = _token(config.state_dir)
    cluster = await LocalCluster.open(config)
    secure_state_dir(config.state_dir)  # and what the node made in it
    _write_private(config.state_dir / "url", f"http://{host}:{port}\n")
    app = create_app(cluster, token, projects=_projects(config.state_dir, token))
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                           access_log=False, http=CoalescingProtocol,
                                           ws="websockets-sansio",
                                           log_config=None))  # logs.configure's JSON
    slog.info(f"dsec: serving on http://{host}:{port}", url=f"http://{host}:{port}",
              node=cluster.node.node_id, sandboxes_recovered=len(cluster.node.records))
    settle_heap()
    await server.serve()


def _projects(state_dir: Path, token: str) -> Projects:
    """The control store of projects, tokens and quotas: ``projects.db`` in the state dir,
    which every gateway started on that state dir shares."""
    return Projects(token, state_dir / "projects.db")


def cluster_credential(state_dir: Path) -> str:
    """What nodes trust their gateways by: DSEC_CLUSTER_TOKEN, else the state dir's
    ``cluster_token`` (created 0600 on first use). Never a user's token."""
    if os.environ.get("DSEC_CLUSTER_TOKEN"):
        return os.environ["DSEC_CLUSTER_TOKEN"]
    token, created = load_or_create_token(state_dir, "cluster_token")
    if created:  # each way of starting a node names it its own way: say both
        path = state_dir / "cluster_token"
        print(f"dsec: new cluster credential in {path}; start node agents with it: "
              f"python -m dsec.cluster.agent --cluster-token-file {path} (a list of node "
              f"agents), or python -m dsec.cluster.ray --cluster-token \"$(cat {path})\" "
              "(Ray); either also reads DSEC_CLUSTER_TOKEN", flush=True)
    return token


async def _serve_ray(state_dir: Path, host: str, port: int, address: str | None) -> None:
    from dsec.cluster.ray import RayCluster, ray_init
    token = _token(state_dir)
    await asyncio.to_thread(ray_init, address)
    await _serve_gateway(RayCluster(cluster_credential(state_dir)), token, state_dir, host,
                         port, "Ray")


async def _serve_static(state_dir: Path, host: str, port: int, urls: list[str]) -> None:
    from dsec.cluster.static import StaticCluster
    token = _token(state_dir)
    await _serve_gateway(StaticCluster(urls, cluster_credential(state_dir)), token, state_dir,
                         host, port, f"{len(urls)} node URL(s)")


async def _serve_gateway(cluster, token: str, state_dir: Path, host: str, port: int,
                         over: str) -> None:
    """A gateway of many remote nodes: the same app, over ``cluster``."""
    _write_private(state_dir / "url", f"http://{host}:{port}\n")
    app = create_app(cluster, token, projects=_projects(state_dir, token))
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port,
                                           log_level="warning", access_log=False,
                                           http=CoalescingProtocol,
                                           ws="websockets-sansio", log_config=None))
    slog.info(f"dsec: gateway on http://{host}:{port} over {over}",
              url=f"http://{host}:{port}", over=over)
    settle_heap()
    await server.serve()


def run_loop(main) -> None:
    """Run the coroutine ``main`` on uvloop when it is installed, else on asyncio's loop (an
    ImportError raised inside ``main`` is its own, not a reason to run it again)."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    uvloop.run(main)


def _token(state_dir: Path) -> str:
    """The API token, on a state directory made private first. The token itself is never
    printed: the log that stdout usually goes to is no place for a secret."""
    secure_state_dir(state_dir)
    token, created = load_or_create_token(state_dir)
    if created:
        slog.info("dsec: new API token created", path=str(state_dir / "token"), mode="0600")
    return token


def secure_state_dir(state_dir: Path) -> None:
    """Make the state directory 0700 and each entry at its top 0700 (a directory) or 0600.

    These modes keep other users out of everything below (the trajectory log, sandbox
    specs with their environment, sockets). Deeper files keep the modes their creators
    chose: a process-wide umask of 077 would also reach the trees the node builds for
    sandboxes (the busybox image, layer roots, upper dirs), and a non-root user in a
    sandbox could then no longer run /bin/sh. Called before the node opens and after."""
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(state_dir, 0o700)
    for entry in os.scandir(state_dir):
        if entry.is_dir(follow_symlinks=False):
            os.chmod(entry.path, 0o700)
        elif entry.is_file(follow_symlinks=False):
            os.chmod(entry.path, 0o600)


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def serve(state_dir: Path | None = None, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
          backends: list[str] | None = None, warm_pool: dict[str, int] | None = None,
          ray_address: str | None = None, images_remote: str | None = None,
          guests: dict | None = None, trajectory: dict | None = None,
          node_urls: list[str] | None = None, registry: dict | None = None) -> None:
    """Run the embedded server (or, with ``ray_address``, a gateway over a Ray cluster;
    with ``node_urls``, a gateway over the node agents' APIs at those URLs)."""
    logs.configure(logging.INFO)  # JSON lines, each with its request's id
    if ray_address is not None or node_urls:
        sd = state_dir or NodeConfig().state_dir
        sd.mkdir(parents=True, exist_ok=True)
        if node_urls:
            run_loop(_serve_static(sd, host, port, node_urls))
        else:
            asyncio.run(_serve_ray(sd, host, port, ray_address))
        return
    kwargs: dict = {"warm_pool": warm_pool or {}}
    if images_remote:
        from dsec.images.sources import RemoteConfig
        kwargs["images_remote"] = RemoteConfig(url=images_remote,
                                               token=os.environ.get("DSEC_IMAGES_TOKEN"))
    if registry:
        from dsec.images.registry import RegistryPolicy
        kwargs["registry"] = RegistryPolicy(**registry)
    if state_dir is not None:
        kwargs["state_dir"] = state_dir
    if backends:
        kwargs["backends"] = backends
    if guests:
        from dsec.node.backends.microvm.config import MicroVMConfig
        kwargs["guests"] = MicroVMConfig(**guests)
    if trajectory:
        from dsec.trajectory.retention import TrajectoryRetention
        kwargs["trajectory"] = TrajectoryRetention(**trajectory)
    run_loop(_serve(NodeConfig(**kwargs), host, port))


def main(argv: list[str] | None = None) -> None:
    """``python -m dsec.gateway.server --state-dir D --port P`` (tests, service units)."""
    import argparse
    p = argparse.ArgumentParser(prog="dsec-server")
    p.add_argument("--state-dir", type=Path, default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--backend", action="append", default=None)
    p.add_argument("--ray", default=None, metavar="ADDRESS",
                   help="be a gateway over the node agents of this Ray cluster ('auto' ok)")
    p.add_argument("--node", action="append", default=[], metavar="URL",
                   help="be a gateway over the node agent whose API answers at URL "
                        "(repeat for each node; they take this gateway's cluster credential)")
    p.add_argument("--images-remote", default=None, metavar="URL",
                   help="load image layers on demand from this layer store "
                        "(token in DSEC_IMAGES_TOKEN)")
    p.add_argument("--registry-pull", action="store_true",
                   help="create(image='host/repo:tag') pulls an image the store lacks")
    p.add_argument("--insecure-registry", action="append", default=[], metavar="HOST",
                   help="reach this registry host:port over plain HTTP (loopback/private)")
    p.add_argument("--warm-pool", action="append", default=[], metavar="IMAGE=N",
                   help="keep N started sandboxes of IMAGE ready for create()")
    p.add_argument("--guest-accel", choices=["auto", "kvm", "tcg"], default="auto",
                   help="microvm/vm accelerator (auto: KVM if a probe guest boots)")
    p.add_argument("--guest-warm-start", action="store_true",
                   help="start microvm sandboxes as clones of a booted template")
    p.add_argument("--guest-pause-to-disk", action="store_true",
                   help="pausing a guest saves it to disk and ends its QEMU (frees its memory)")
    p.add_argument("--trajectory-keep-s", type=float, default=None, metavar="S",
                   help="keep a stopped sandbox's trajectory log this long (default a day)")
    p.add_argument("--trajectory-max-mb", type=float, default=None, metavar="MB",
                   help="prune stopped sandboxes' logs, oldest first, beyond this size")
    a = p.parse_args(argv)
    pool = {}
    for item in a.warm_pool:
        image, _, n = item.rpartition("=")
        if not image or not n.isdigit():
            p.error(f"--warm-pool takes IMAGE=N; got {item!r}")
        pool[image] = int(n)
    if a.ray and a.node:
        p.error("--ray and --node are two ways to find nodes; give one")
    serve(a.state_dir, a.host, a.port, a.backend, pool, a.ray, a.images_remote,
          guest_options(a.guest_accel, a.guest_warm_start, a.guest_pause_to_disk),
          trajectory_options(a.trajectory_keep_s, a.trajectory_max_mb), a.node,
          registry_options(a.registry_pull, a.insecure_registry))


def registry_options(pull: bool, insecure: list[str] | None) -> dict:
    """The RegistryPolicy fields the serve flags set."""
    return {"pull_on_first_use": pull, "insecure": list(insecure or [])}


def trajectory_options(keep_s: float | None, max_mb: float | None) -> dict:
    """The trajectory retention settings the command line changed."""
    out: dict = {}
    if keep_s is not None:
        out["stopped_grace_s"] = keep_s
    if max_mb is not None:
        out["max_mb"] = max_mb
    return out


def guest_options(accel: str, warm_start: bool, pause_to_disk: bool) -> dict:
    """The microvm/vm settings the command line changed (the rest keep their defaults)."""
    out: dict = {"accel": accel} if accel != "auto" else {}
    if warm_start:
        out["warm_start"] = True
    if pause_to_disk:
        out["pause_to_disk"] = True
    return out


if __name__ == "__main__":
    main()
