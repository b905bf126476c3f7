"""Many simulated node agents in one process, each with its own HTTP API on loopback.

For control-plane benchmarks and tests only (see :mod:`dsec.node.backends.simulated`):
each node is a real :class:`~dsec.node.service.NodeService` whose one backend keeps
records and runs nothing, served by the node API every node agent has (the gateway app
over its :class:`~dsec.cluster.local.LocalCluster`) on its own uvicorn server and port. A
gateway over their URLs (:class:`~dsec.cluster.static.StaticCluster`) so exercises the
real HTTP path to every node. Each node counts the requests it was sent.

``python -m dsec.cluster.simulated --nodes 20 --state-dir D --token-file F`` hosts them in
a process of its own: it prints one JSON line ``{"urls": [...]}`` once all answer, then
answers commands on stdin, one per line, with one JSON line each: ``counts`` (requests
each node was sent, by route), ``sandboxes`` (how many each node holds), ``clear`` (stop
every sandbox, in process), ``quit``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys
from collections import Counter
from pathlib import Path

import uvicorn

from dsec.gateway.coalesce import CoalescingProtocol

__all__ = ["SimulatedNodes", "RequestCounter", "route_of"]


def route_of(method: str, path: str) -> str:
    """``POST /v1/sandboxes/{id}/exec`` for ``POST /v1/sandboxes/sb-1a2b-3c4d/exec``. Pure."""
    parts = ["{id}" if p.startswith(("sb-", "sh-")) else p for p in path.split("/")]
    return f"{method} {'/'.join(parts)}"


class RequestCounter:
    """Plain ASGI middleware: counts every HTTP request by :func:`route_of`."""

    def __init__(self, app) -> None:
        self.app = app
        self.counts: Counter[str] = Counter()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            self.counts[route_of(scope["method"], scope["path"])] += 1
        return await self.app(scope, receive, send)


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signals alone: many share one process, whose owner
    decides when they end."""

    def capture_signals(self):
        return contextlib.nullcontext()


class _Node:
    def __init__(self, node, counter: RequestCounter, server, task, url: str) -> None:
        self.node, self.counter, self.server, self.task, self.url = (node, counter, server,
                                                                     task, url)


class SimulatedNodes:
    """``count`` simulated node agents under ``root`` (one state dir each), serving on
    ``host``; ``config`` goes to each node's :class:`~dsec.node.config.NodeConfig`."""

    def __init__(self, root: Path, count: int, token: str, host: str = "127.0.0.1",
                 **config) -> None:
        self.root, self.count, self.token, self.host = root, count, token, host
        self.config = config
        self.nodes: list[_Node] = []

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    async def start(self) -> list[str]:
        for i in range(self.count):
            self.nodes.append(await self._start_one(self.root / f"node{i}"))
        return self.urls

    async def _start_one(self, state_dir: Path) -> _Node:
        from dsec.cluster.http import NODE_KEEPALIVE_S
        from dsec.cluster.local import LocalCluster
        from dsec.gateway.app import create_app
        from dsec.node.backends.simulated import open_simulated_node

        node = await open_simulated_node(state_dir, **self.config)
        counter = RequestCounter(create_app(LocalCluster(node), self.token,
                                            close_cluster=False, node_api=True))
        # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets that say so, and
        # without it a response's head and body meet Nagle and delayed ACKs (40 ms)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, 0))
        server = _Server(uvicorn.Config(counter, log_level="warning", access_log=False,
                                          http=CoalescingProtocol,
                                          timeout_keep_alive=NODE_KEEPALIVE_S, lifespan="on"))
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        port = sock.getsockname()[1]
        return _Node(node, counter, server, task, f"http://{self.host}:{port}")

    def counts(self) -> dict[str, dict[str, int]]:
        return {n.node.node_id: dict(n.counter.counts) for n in self.nodes}

    def sandboxes(self) -> dict[str, int]:
        return {n.node.node_id: len(n.node.records) for n in self.nodes}

    async def clear(self) -> int:
        """Stop every sandbox of every node here, in process (no HTTP); how many."""
        stopped = 0
        for n in self.nodes:
            ids = list(n.node.records)
            await asyncio.gather(*(n.node.stop(i) for i in ids))
            stopped += len(ids)
        return stopped

    async def kill(self, index: int) -> None:
        """Node ``index`` stops answering, as if its agent died: its port closes (what
        is in flight finishes first), its records stay on disk."""
        n = self.nodes[index]
        n.server.should_exit = True
        await n.task
        await n.node.close()

    async def close(self) -> None:
        """Every sandbox stopped, every server and node closed."""
        for i, n in enumerate(self.nodes):
            if n.task.done():
                continue
            await asyncio.gather(*(n.node.stop(s) for s in list(n.node.records)))
            await self.kill(i)


async def _host(a) -> None:
    token = Path(a.token_file).read_text().strip()
    nodes = SimulatedNodes(Path(a.state_dir), a.nodes, token)
    await nodes.start()
    from dsec.gateway.server import settle_heap
    settle_heap()  # as a real node agent does once it serves (dsec.cluster.agent)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    def say(obj) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    say({"urls": nodes.urls, "node_ids": [n.node.node_id for n in nodes.nodes]})
    try:
        while line := (await reader.readline()).decode().strip():
            if line == "counts":
                say(nodes.counts())
            elif line == "sandboxes":
                say(nodes.sandboxes())
            elif line == "clear":
                say({"stopped": await nodes.clear()})
            elif line == "quit":
                break
            else:
                say({"error": f"unknown command {line!r}"})
    finally:
        await nodes.close()
    say({"closed": True})


def main(argv: list[str] | None = None) -> None:
    import argparse
    p = argparse.ArgumentParser(prog="dsec-simulated-nodes",
                                description="simulated node agents, for benchmarks only")
    p.add_argument("--nodes", type=int, default=20)
    p.add_argument("--state-dir", required=True)
    p.add_argument("--token-file", required=True)
    a = p.parse_args(argv)
    from dsec.gateway.server import run_loop
    run_loop(_host(a))


if __name__ == "__main__":
    main()
