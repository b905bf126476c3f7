"""``dsec serve``: the embedded server (gateway + one node agent in one process)."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import uvicorn

from dsec.cluster.local import LocalCluster
from dsec.gateway.app import create_app
from dsec.gateway.auth import load_or_create_token
from dsec.node.config import NodeConfig

__all__ = ["serve", "DEFAULT_PORT"]

DEFAULT_PORT = 7070
log = logging.getLogger("dsec.gateway")


async def _serve(config: NodeConfig, host: str, port: int, on_ready=None) -> None:
    token, created = load_or_create_token(config.state_dir)
    if created:
        print(f"dsec: new API token (stored 0600 in {config.state_dir / 'token'}):\n  {token}",
              flush=True)
    cluster = await LocalCluster.open(config)
    (config.state_dir / "url").write_text(f"http://{host}:{port}\n")
    app = create_app(cluster, token)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                           access_log=False, ws="websockets-sansio"))
    print(f"dsec: serving on http://{host}:{port} (node {cluster.node.node_id}, "
          f"{len(cluster.node.records)} sandboxes recovered)", flush=True)
    await server.serve()


async def _serve_ray(state_dir: Path, host: str, port: int, address: str | None) -> None:
    from dsec.cluster.ray import RayCluster, ray_init
    from dsec.gateway.proxy import create_proxy_app
    token, created = load_or_create_token(state_dir)
    if created:
        print(f"dsec: new API token (stored 0600 in {state_dir / 'token'}):\n  {token}",
              flush=True)
    await asyncio.to_thread(ray_init, address)
    cluster = RayCluster()
    (state_dir / "url").write_text(f"http://{host}:{port}\n")
    server = uvicorn.Server(uvicorn.Config(create_proxy_app(cluster, token), host=host,
                                           port=port, log_level="warning", access_log=False))
    nodes = await cluster.endpoints(force=True)
    print(f"dsec: gateway on http://{host}:{port} over Ray ({len(nodes)} nodes)", flush=True)
    await server.serve()


def serve(state_dir: Path | None = None, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
          backends: list[str] | None = None, warm_pool: dict[str, int] | None = None,
          ray_address: str | None = None, images_remote: str | None = None,
          guests: dict | None = None) -> None:
    """Run the embedded server (or, with ``ray_address``, a gateway over a Ray cluster)."""
    if ray_address is not None:
        sd = state_dir or NodeConfig().state_dir
        sd.mkdir(parents=True, exist_ok=True)
        asyncio.run(_serve_ray(sd, host, port, ray_address))
        return
    kwargs: dict = {"warm_pool": warm_pool or {}}
    if images_remote:
        from dsec.images.sources import RemoteConfig
        kwargs["images_remote"] = RemoteConfig(url=images_remote,
                                               token=os.environ.get("DSEC_IMAGES_TOKEN"))
    if state_dir is not None:
        kwargs["state_dir"] = state_dir
    if backends:
        kwargs["backends"] = backends
    if guests:
        from dsec.node.backends.microvm.config import MicroVMConfig
        kwargs["guests"] = MicroVMConfig(**guests)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        import uvloop
        uvloop.run(_serve(NodeConfig(**kwargs), host, port))
    except ImportError:
        asyncio.run(_serve(NodeConfig(**kwargs), host, port))


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
    p.add_argument("--images-remote", default=None, metavar="URL",
                   help="load image layers on demand from this layer store "
                        "(token in DSEC_IMAGES_TOKEN)")
    p.add_argument("--warm-pool", action="append", default=[], metavar="IMAGE=N",
                   help="keep N started sandboxes of IMAGE ready for create()")
    p.add_argument("--guest-accel", choices=["auto", "kvm", "tcg"], default="auto",
                   help="microvm/vm accelerator (auto: KVM if a probe guest boots)")
    p.add_argument("--guest-warm-start", action="store_true",
                   help="start microvm sandboxes as clones of a booted template")
    p.add_argument("--guest-pause-to-disk", action="store_true",
                   help="pausing a guest saves it to disk and ends its QEMU (frees its memory)")
    a = p.parse_args(argv)
    pool = {}
    for item in a.warm_pool:
        image, _, n = item.rpartition("=")
        if not image or not n.isdigit():
            p.error(f"--warm-pool takes IMAGE=N; got {item!r}")
        pool[image] = int(n)
    serve(a.state_dir, a.host, a.port, a.backend, pool, a.ray, a.images_remote,
          guest_options(a.guest_accel, a.guest_warm_start, a.guest_pause_to_disk))


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
