"""The multi-machine cluster: a node agent per host as a Ray actor, gateways find them via Ray.

Each :class:`NodeActor` runs the ordinary node agent plus its own HTTP API (the same app the
embedded server uses, over just that node) on the host's address. A gateway (the same app
again, over a :class:`RayCluster`) lists the actors by name in the ``dsec`` namespace, talks
to each through an :class:`~dsec.cluster.http.HttpNodeClient`, and reaches the node named in
a sandbox id (``sb-<node>-<rand>``) with no lookup. So nothing in ``node/`` knows it runs
under Ray, and every route, streaming included, is written once for both modes.

Ray is imported lazily: the embedded server does not need it.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path

from dsec.cluster.agent import NodeAgent
from dsec.cluster.http import HttpNodeClient
from dsec.cluster.remote import RemoteNodes


__all__ = ["NAMESPACE", "NodeEndpoint", "RayCluster", "start_node_actor", "node_actor_class"]

NAMESPACE = "dsec"
PREFIX = "dsec-node-"


@dataclass(frozen=True)
class NodeEndpoint:
    """Where a node's HTTP API answers, and the actor behind it."""

    node_id: str
    url: str
    actor: object


def _host_address() -> str:
    import ray
    return ray.util.get_node_ip_address()


class _NodeActor(NodeAgent):
    """A :class:`~dsec.cluster.agent.NodeAgent` inside a Ray worker, on the address Ray
    knows this machine by unless told another."""

    def __init__(self, state_dir: str, token: str, backends: list[str],
                 host: str | None = None, port: int = 0,
                 warm_pool: dict[str, int] | None = None) -> None:
        super().__init__(state_dir, token, backends, host or _host_address(), port,
                         warm_pool)


def node_actor_class():
    """The Ray actor class (built on first use so that importing dsec needs no Ray)."""
    import ray
    # The node process adopts its containers' inits (node/host/reaper.py), and a Ray
    # worker kills its direct children when it exits: that would take every sandbox of a
    # killed or restarted node agent with it, where they are meant to outlive it.
    keep_children = {"env_vars": {"RAY_kill_child_processes_on_worker_exit": "0"}}
    return ray.remote(num_cpus=0, max_concurrency=1000,
                      runtime_env=keep_children)(_NodeActor)


def start_node_actor(state_dir: Path, token: str, backends: list[str] | None = None,
                     resources: dict[str, float] | None = None, detached: bool = False,
                     warm_pool: dict[str, int] | None = None) -> NodeEndpoint:
    """Start a node agent on this machine (or where ``resources`` point) and wait for it."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from dsec.node.store import ensure_node_id
    node_id = ensure_node_id(state_dir / "node.db")
    opts: dict = {"name": PREFIX + node_id.removeprefix("node-"), "namespace": NAMESPACE,
                  "get_if_exists": True}
    if resources:
        opts["resources"] = resources
    else:
        here = ray.get_runtime_context().get_node_id()
        opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(here, soft=False)
    if detached:
        opts["lifetime"] = "detached"
    actor = node_actor_class().options(**opts).remote(str(state_dir), token,
                                                      backends or ["container"], None, 0,
                                                      warm_pool)
    got_id, url = ray.get(actor.start.remote())
    return NodeEndpoint(node_id=got_id, url=url, actor=actor)


class RayCluster(RemoteNodes):
    """The gateway's view of a Ray cluster: an :class:`HttpNodeClient` per node agent,
    discovered through Ray (named actors) every ``refresh_s`` in the background."""

    async def discover(self) -> None:
        found = await asyncio.to_thread(_discover)
        for short, ep in found.items():
            old = self._clients.get(short)
            if old is None or old.url != ep.url:  # new, or restarted on another port
                self._clients[short] = HttpNodeClient(ep.node_id, ep.url, self.token)
                if old is not None:
                    await old.close()


def _discover() -> dict[str, NodeEndpoint]:
    import ray
    out = {}
    for name in ray.util.list_named_actors(all_namespaces=True):
        if isinstance(name, dict):
            if name.get("namespace") != NAMESPACE:
                continue
            name = name["name"]
        if not name.startswith(PREFIX):
            continue
        try:
            actor = ray.get_actor(name, namespace=NAMESPACE)
            node_id, url = ray.get(actor.endpoint.remote(), timeout=10)
        except Exception:  # a node that is going away; the next refresh drops it
            continue
        out[name.removeprefix(PREFIX)] = NodeEndpoint(node_id=node_id, url=url, actor=actor)
    return out


def ray_init(address: str | None) -> None:
    """Connect this process to a Ray cluster (``auto`` or ``host:port``)."""
    import ray
    if not ray.is_initialized():
        ray.init(address=address or os.environ.get("RAY_ADDRESS") or "auto",
                 namespace=NAMESPACE, log_to_driver=False)


def main(argv: list[str] | None = None) -> None:
    """``python -m dsec.cluster.ray --address A --state-dir D --cluster-token T``: start
    this machine's node agent as a detached actor in the Ray cluster, then exit."""
    import argparse
    p = argparse.ArgumentParser(prog="dsec-node")
    p.add_argument("--address", default=None, help="Ray address (default: auto)")
    p.add_argument("--state-dir", type=Path, default=Path("/var/lib/dsec"))
    p.add_argument("--cluster-token", "--token", dest="token",
                   default=os.environ.get("DSEC_CLUSTER_TOKEN"),
                   help="the cluster credential the gateways hold (their state dir's "
                        "cluster_token); the node's API takes no other, no user's token")
    p.add_argument("--backend", action="append", default=None)
    a = p.parse_args(argv)
    if not a.token:
        p.error("--cluster-token (or DSEC_CLUSTER_TOKEN) is required: the node trusts only "
                "gateways holding it")
    ray_init(a.address)
    ep = start_node_actor(a.state_dir, a.token, a.backend, detached=True)
    print(f"dsec node {ep.node_id} serving at {ep.url}")


if __name__ == "__main__":
    main()
