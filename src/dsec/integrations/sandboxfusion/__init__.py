"""SandboxFusion-compatible ``run_code`` on dsec's fncall backend.

Point a SandboxFusion client at ``<dsec>/sandboxfusion/<token>``: ``sandbox_fusion.
set_endpoint(url)`` or verl's ``sandbox_fusion_url: <url>/run_code``. :func:`install` adds
the routes and the path-token middleware to a gateway app.
"""

from __future__ import annotations

from dsec.integrations.sandboxfusion.routes import DEFAULT_IMAGES, PREFIX, PathToken, router

__all__ = ["install", "router", "PathToken", "PREFIX", "DEFAULT_IMAGES"]


def install(app, images: list[str] | None = None) -> None:
    """Serve SandboxFusion's API on ``app``; a language runs in the first of ``images``
    (default :data:`DEFAULT_IMAGES`) that exists and has its toolchain. Call after every
    other middleware is added: the path token must become a header before auth runs."""
    app.include_router(router)
    if images:
        app.state.sandboxfusion_images = list(images)
    app.add_middleware(PathToken)
