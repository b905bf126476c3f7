"""The gateway's HTTP app: auth, error mapping, metrics, and the API routers."""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from dsec.cluster.base import Cluster
from dsec.gateway.auth import BearerAuth
from dsec.gateway.guard import RequestGuard, install_error_handlers
from dsec.gateway.routes import (files, fncall, images, jobs, network, sandboxes, streams,
                                 trajectory)
from dsec.node import metrics

__all__ = ["create_app"]


def create_app(cluster: Cluster, token: str, close_cluster: bool = True) -> FastAPI:
    """The gateway app over ``cluster``; every route but /healthz needs ``token``."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        if close_cluster:
            await cluster.close()

    app = FastAPI(title="dsec", version="0.1.0", lifespan=lifespan,
                  description="Elastic sandboxes for agentic RL and LLM agent evaluation.")
    app.state.cluster = cluster

    install_error_handlers(app)

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict:
        return {"ok": True}

    @app.get("/metrics", include_in_schema=False)
    async def prometheus() -> Response:
        counts: dict[str, int] = {s: 0 for s in ("running", "paused", "starting")}
        for node in cluster.nodes():
            for rec in node.records.values():
                counts[rec.state] = counts.get(rec.state, 0) + 1
        for state, n in counts.items():
            metrics.SANDBOXES.labels(state).set(n)
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    app.include_router(sandboxes.router)
    app.include_router(files.router)
    app.include_router(streams.router)
    app.include_router(fncall.router)
    app.include_router(jobs.router)
    app.include_router(network.router)
    app.include_router(trajectory.router)
    app.include_router(images.router)
    _mount_images(app, cluster)
    app.add_middleware(RequestGuard)  # inside auth: a caller without the token learns nothing
    app.add_middleware(BearerAuth, token=token)
    return app


def _mount_images(app: FastAPI, cluster: Cluster) -> None:
    """Blob and manifest routes of the layer store, when the images package offers them."""
    try:
        from dsec.images.http import blob_router
    except ImportError:
        return
    images = getattr(cluster.nodes()[0].backends.get("container"), "images", None)
    if images is not None:
        app.include_router(blob_router(images))
