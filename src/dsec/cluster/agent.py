"""A node agent serving its own HTTP API: the NodeService of one machine and the gateway app
over just that node (``node_api``), which gateways reach through an
:class:`~dsec.cluster.http.HttpNodeClient`.

Under Ray each host runs one as an actor (:mod:`dsec.cluster.ray`); without Ray,
``python -m dsec.cluster.agent --state-dir D --port P`` runs one in the foreground for
gateways started with ``--node URL`` (:class:`~dsec.cluster.static.StaticCluster`). Its API
takes the cluster credential only (``DSEC_CLUSTER_TOKEN`` or ``--cluster-token-file``), never
a user's token. SIGTERM or SIGINT ends the agent and leaves its sandboxes running: a
restarted agent on the same state dir finds them again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
from pathlib import Path

from dsec.cluster.http import NODE_KEEPALIVE_S
from dsec.placement.admission import NodeLoad

__all__ = ["NodeAgent", "main"]


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class NodeAgent:
    """A NodeService and its HTTP API on ``host:port`` (any free port for 0)."""

    def __init__(self, state_dir: str, token: str, backends: list[str],
                 host: str = "127.0.0.1", port: int = 0,
                 warm_pool: dict[str, int] | None = None, own_signals: bool = True) -> None:
        self.state_dir = Path(state_dir)
        self.token = token
        self.backends = backends
        self.host = host
        self.port = port
        self.warm_pool = warm_pool or {}
        self.node = None
        self.server = None
        self.url = ""
        self.own_signals = own_signals  # False: the caller handles SIGTERM and SIGINT

    async def start(self) -> tuple[str, str]:
        """Open the node and serve; its id and URL."""
        from dsec.node.config import NodeConfig
        from dsec.node.service import NodeService

        port = self.port or _free_port(self.host)
        config = NodeConfig(state_dir=self.state_dir, backends=self.backends,
                            warm_pool=self.warm_pool)
        self.node = await NodeService.open(config)
        try:
            await self._serve(port)
        except BaseException:  # e.g. the port is taken: the node's mounts go with it
            node, self.node, self.server = self.node, None, None
            await node.close()
            raise
        return self.node.node_id, self.url

    async def _serve(self, port: int) -> None:
        import uvicorn

        from dsec.cluster.local import LocalCluster
        from dsec.gateway.app import create_app
        from dsec.gateway.coalesce import CoalescingProtocol
        from dsec.gateway.server import settle_heap

        app = create_app(LocalCluster(self.node), self.token, close_cluster=False,
                         node_api=True)
        self.server = uvicorn.Server(uvicorn.Config(app, host=self.host, port=port,
                                                    log_level="warning", access_log=False,
                                                    http=CoalescingProtocol,
                                                    timeout_keep_alive=NODE_KEEPALIVE_S,
                                                    ws="websockets-sansio"))
        if not self.own_signals:
            self.server.capture_signals = contextlib.nullcontext
        settle_heap()  # as the embedded server does: the collector off the node's heap
        self._task = asyncio.create_task(self.server.serve())
        while not self.server.started:
            if self._task.done():
                self._task.result()
            await asyncio.sleep(0.02)
        self.url = f"http://{self.host}:{port}"

    async def endpoint(self) -> tuple[str, str]:
        return self.node.node_id, self.url

    async def load(self) -> NodeLoad:
        return self.node.load()

    async def shutdown(self, stop_sandboxes: bool = True) -> None:
        """Stop serving; with ``stop_sandboxes`` also stop every sandbox and unmount layers."""
        if self.server is not None:
            self.server.should_exit = True
            await self._task
        if self.node is not None:  # with no sandbox left, close() also unmounts the layers
            await self.node.close(stop_sandboxes=stop_sandboxes)


async def _run(agent: NodeAgent) -> None:
    node_id, url = await agent.start()
    print(json.dumps({"node_id": node_id, "url": url}), flush=True)
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, done.set)
    try:
        await done.wait()
    finally:
        await agent.shutdown(stop_sandboxes=False)


def main(argv: list[str] | None = None) -> None:
    """``python -m dsec.cluster.agent --state-dir D [--host H] [--port P]``: this machine's
    node agent in the foreground; prints one JSON line ``{"node_id", "url"}`` once it
    answers."""
    import argparse
    p = argparse.ArgumentParser(prog="dsec-node-agent")
    p.add_argument("--state-dir", type=Path, default=Path("/var/lib/dsec"))
    p.add_argument("--host", default="127.0.0.1",
                   help="address to serve the node API on (the gateways must reach it)")
    p.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    p.add_argument("--cluster-token-file", type=Path, default=None,
                   help="file holding the cluster credential the gateways hold (their state "
                        "dir's cluster_token); else DSEC_CLUSTER_TOKEN")
    p.add_argument("--backend", action="append", default=None)
    a = p.parse_args(argv)
    try:
        token = (a.cluster_token_file.read_text().strip() if a.cluster_token_file
                 else os.environ.get("DSEC_CLUSTER_TOKEN", ""))
    except (OSError, UnicodeDecodeError) as exc:
        p.error(f"cannot read the cluster credential from {a.cluster_token_file}: "
                f"{getattr(exc, 'strerror', None) or exc}")
    if not token:
        p.error("a cluster credential is required (--cluster-token-file or "
                "DSEC_CLUSTER_TOKEN): the node trusts only gateways holding it")
    from dsec.gateway import logs
    logs.configure(logging.INFO)  # JSON lines, each with its request's id
    agent = NodeAgent(str(a.state_dir), token, a.backend or ["container"], a.host, a.port,
                      own_signals=False)
    from dsec.gateway.server import run_loop
    run_loop(_run(agent))


if __name__ == "__main__":
    main()
