"""An E2B-compatible API, so the unmodified ``e2b`` SDK drives dsec sandboxes.

Point the SDK at a dsec gateway::

    E2B_API_URL=<dsec>/e2b  E2B_SANDBOX_URL=<dsec>/e2b/envd  E2B_API_KEY=<dsec token>

``/e2b`` is E2B's control plane (:mod:`.control`), ``/e2b/envd`` the in-sandbox daemon's
Connect RPC and file routes (:mod:`.envd`). Both reach sandboxes only through the
gateway's routes and :class:`~dsec.cluster.nodeclient.NodeClient`, so they work the same in
``dsec serve`` and over a cluster, and they check the caller themselves (E2B's headers are
not dsec's bearer token), which is why the gateway's auth leaves :data:`OWN_AUTH` to them.
Signed file URLs (``download_url``/``upload_url``) point at ``<dsec>/files``: the SDK
builds them that way.
"""

from __future__ import annotations

from fastapi import FastAPI

from dsec.integrations.e2b.auth import Keys
from dsec.integrations.e2b.config import E2BConfig
from dsec.integrations.e2b.control import control_router, fallback_router
from dsec.integrations.e2b.envd import (SIGNED_FILES, envd_fallback_router, envd_router,
                                        signed_files_router)

__all__ = ["mount", "E2BConfig", "PREFIX", "OWN_AUTH"]

PREFIX = "/e2b"
OWN_AUTH = (PREFIX, SIGNED_FILES)  # the paths whose routes check their callers themselves


def mount(app: FastAPI, token: str, config: E2BConfig | None = None) -> None:
    """Add the E2B routes to the gateway ``app``, checking callers against ``token``."""
    config = config or E2BConfig()
    app.state.e2b_keys = Keys(token)
    # in this order: envd's routes before the control plane's /e2b/sandboxes/{id}, and the
    # catch-alls (an unserved path answers in its protocol's shape) last
    for router in (envd_router(config), control_router(config), signed_files_router(),
                   envd_fallback_router(), fallback_router()):
        app.include_router(router)
