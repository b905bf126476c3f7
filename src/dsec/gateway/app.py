"""The gateway's HTTP app: auth, error mapping, metrics, and the API routers.

One app, every route written once, over any :class:`~dsec.cluster.base.Cluster`: the
embedded node of ``dsec serve``, the node agents of a Ray cluster, and each node agent's
own API (this app over its :class:`~dsec.cluster.local.LocalCluster`). Routes reach nodes
only through :class:`~dsec.cluster.nodeclient.NodeClient`; placement reads the watcher.
"""

from __future__ import annotations

import inspect
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from dsec import __version__
from dsec.api.errors import NodeLost
from dsec.api.limits import DEFAULT_LIMITS
from dsec.api.scope import caller_scope
from dsec.cluster.base import Cluster
from dsec.gateway import fastlane, metrics
from dsec.gateway.auth import BearerAuth, ClusterAuth
from dsec.gateway.guard import RequestGuard, install_error_handlers
from dsec.gateway.logs import RequestIds
from dsec.gateway.openapi import DocsPages, install_openapi, operation_id
from dsec.gateway.placer import Placer
from dsec.gateway.projects import Projects
from dsec.gateway.routes import (files, fncall, images, jobs, network, processes, sandboxes,
                                 streams, trajectory)
from dsec.gateway.routes import projects as project_routes
from dsec.gateway.routes.common import Gateway
from dsec.gateway.watcher import Watcher
from dsec.integrations import e2b, sandboxfusion

__all__ = ["create_app"]

_DESCRIPTION = f"""Elastic sandboxes for agentic RL and LLM agent evaluation.

Every error answers `{{"error": {{"code": ..., "message": ...}}}}`; the message says what to
change. Limits (a node's `NodeConfig.limits`; the defaults shown): a JSON request body holds
at most {DEFAULT_LIMITS.body_bytes} bytes (else 413 `too_large`; file and tar uploads stream
and are bounded by the sandbox's `disk_mb` and `memory_mb`); each field's own limit is in
its schema and named `limits.<field>` in a refusal. `capacity` (429, with `Retry-After`)
means no node has room now; `node_lost` (503) that the node holding a sandbox does not
answer.

Not in this document: the terminal WebSocket `/v1/sandboxes/{{sb_id}}/pty` (binary frames of
terminal bytes both ways, a text frame `{{"resize": [rows, cols]}}`, the server's last frame
`{{"exit": code}}`), and the E2B- and SandboxFusion-compatible routes (their own protocols).

Generated clients: bytes travel as `application/octet-stream`, `application/x-tar` and
`image/png`, streamed exec events as `application/x-ndjson` (one `ExecEvent` per line).
openapi-python-client knows only the first of these: give it `content_type_overrides`
mapping the others to `application/octet-stream` (NDJSON to `text/plain`). With
openapi-typescript pass `--default-non-nullable false`: by default it types a request's
fields that have a default as required."""


def create_app(cluster: Cluster, token: str, close_cluster: bool = True,
               watcher: Watcher | None = None,
               e2b_config: e2b.E2BConfig | None = None, projects: Projects | None = None,
               node_api: bool = False) -> FastAPI:
    """The gateway app over ``cluster``; every route but /healthz needs a token (the
    E2B-compatible routes under /e2b take the root token as E2B's API key).

    A gateway: ``token`` is the root project's admin, and ``projects`` (by default a
    store of this gateway's own, in memory) holds the other tokens and the quotas. A
    node agent's own API (``node_api``): ``token`` is the cluster credential, the only
    one it takes, and the gateways in front of it enforce projects."""
    watcher = watcher or Watcher(cluster)
    if not node_api and projects is None:
        projects = Projects(token)
    gateway = Gateway(cluster=cluster, watcher=watcher, placer=Placer(cluster, watcher),
                      projects=None if node_api else projects)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await cluster.start()
        await watcher.start()
        if gateway.projects is not None:
            gateway.projects.start(gateway)
        try:
            yield
        finally:
            if gateway.projects is not None:
                await gateway.projects.stop()
            await watcher.stop()
            if close_cluster:
                await cluster.close()

    app = FastAPI(title="dsec", version=__version__, lifespan=lifespan,
                  description=_DESCRIPTION, docs_url=None, redoc_url=None,
                  generate_unique_id_function=operation_id, **_no_otel())
    app.state.gateway = gateway
    install_error_handlers(app)

    @app.exception_handler(NodeLost)
    async def _node_lost(request: Request, exc: NodeLost) -> JSONResponse:
        if node_id := getattr(exc, "node_id", None):  # tell the watcher now, not next tick
            watcher.report_failure(node_id, str(exc))
        return JSONResponse(exc.to_wire(), status_code=exc.status)

    def unhealthy() -> tuple[int, list[str]]:
        """How many nodes are known, and those not (yet, or no longer) answering the
        watcher: placement skips them."""
        nodes = {c.node_id for c in cluster.clients()} | set(watcher.views)
        return len(nodes), sorted(n for n in nodes if not watcher.healthy(n))

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> JSONResponse:
        known, down = unhealthy()
        return JSONResponse({"ok": True, "nodes": known, "unhealthy": down})

    @app.get("/metrics", include_in_schema=False)
    async def prometheus() -> Response:
        known, down = unhealthy()
        metrics.NODES.labels("healthy").set(known - len(down))
        metrics.NODES.labels("unhealthy").set(len(down))
        for view in watcher.views.values():
            if view.load is not None:
                metrics.NODE_SANDBOXES.labels(view.node_id).set(view.load.sandboxes)
        text = metrics.scoped(generate_latest().decode(), caller_scope.get())
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    for module in (sandboxes, processes, files, streams, fncall, jobs, network, trajectory,
                   images):
        app.include_router(module.router, tags=[module.__name__.rsplit(".", 1)[-1]])
    if gateway.projects is not None:
        app.include_router(project_routes.router, tags=["projects"])
    _mount_images(app, cluster)
    e2b.mount(app, token, e2b_config)
    app.add_middleware(RequestGuard)  # inside auth: a caller without the token learns nothing
    if gateway.projects is None:
        app.add_middleware(ClusterAuth, token=token, delegated=e2b.OWN_AUTH)
    else:
        app.add_middleware(BearerAuth, projects=gateway.projects, delegated=e2b.OWN_AUTH)
    app.add_middleware(DocsPages)  # outside the bearer check: a browser sends no header
    # every request's log lines carry its id; it is counted by route and status there too
    app.add_middleware(RequestIds, metrics=metrics.RequestMetrics())
    sandboxfusion.install(app)  # outermost: its URL token becomes the header auth reads
    install_openapi(app)
    fastlane.install(app)  # after every router: the hot routes skip FastAPI's routing
    return app


def _no_otel() -> dict:
    """FastAPI's OpenTelemetry hooks off: they looked up the tracer and meter providers on
    every request (3 % of a node's CPU per create), and dsec exports Prometheus metrics."""
    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        return {}  # a FastAPI from before the hooks
    return {"telemetry": {"tracing": False, "metrics": False, "logs": False}}


def _mount_images(app: FastAPI, cluster: Cluster) -> None:
    """Blob and manifest routes of the layer store, when this gateway has one."""
    try:
        from dsec.images.http import blob_router
    except ImportError:
        return
    images = cluster.image_store()
    if images is not None:
        app.include_router(blob_router(images), tags=["blobs"])
