"""The gateway's own HTTP API, called in process: what the SandboxFusion routes run on.

Each call goes through the whole app (auth with the caller's token, the request guard, the
fncall route and its placement), as an HTTP client's would, but over an ASGI transport:
no socket, no second server. Which images can run which language is probed once per image
(a bash script of ``command -v`` tests) and kept for a while.
"""

from __future__ import annotations

import asyncio
import time

import httpx

from dsec.api.errors import Internal, error_from_wire
from dsec.api.fncall import FnCallRequest, FnCallResult
from dsec.integrations.sandboxfusion.languages import parse_probe, probe_script
from dsec.integrations.sandboxfusion.plan import DEFAULT_MEMORY_MB, DISK_MB, PIDS

__all__ = ["InProcessGateway", "Availability"]

IMAGES_TTL_S = 10.0    # a newly built image is seen within this
PROBE_TTL_S = 300.0    # an image's toolchains change only when it is rebuilt


class InProcessGateway:
    """``POST /v1/fncall`` and ``GET /v1/images`` on ``app``, as the caller ``auth``."""

    def __init__(self, app) -> None:
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                      base_url="http://dsec.invalid", timeout=None)

    async def _call(self, method: str, path: str, auth: str, **kw) -> object:
        resp = await self.http.request(method, path, headers={"authorization": auth}, **kw)
        body = resp.json() if resp.content else None
        if resp.status_code >= 400:
            raise error_from_wire(body, resp.status_code)
        return body

    async def fncall(self, req: FnCallRequest, auth: str) -> FnCallResult:
        body = await self._call("POST", "/v1/fncall", auth, json=req.model_dump(mode="json"))
        return FnCallResult.model_validate(body)

    async def images(self, auth: str) -> set[str]:
        return {i["name"] for i in await self._call("GET", "/v1/images", auth)}

    async def aclose(self) -> None:
        await self.http.aclose()


class Availability:
    """Which of ``images`` (in order of preference) runs each language."""

    def __init__(self, gateway: InProcessGateway, images: list[str]) -> None:
        self.gateway = gateway
        self.images = images
        # Both kept per caller: which images a token sees (and so what a name means) is
        # its project's, and a snapshot one project owns is missing to another.
        self._known: dict[str, tuple[float, set[str]]] = {}
        self._probed: dict[tuple[str, str], tuple[float, frozenset[str]]] = {}
        self._lock = asyncio.Lock()

    async def image_for(self, language: str, auth: str) -> str | None:
        """The first image that exists and has ``language``; None if none has."""
        for image in await self._existing(auth):
            if language in await self.languages(image, auth):
                return image
        return None

    async def _existing(self, auth: str) -> list[str]:
        now = time.monotonic()
        known = self._known.get(auth)
        if known is None or now - known[0] > IMAGES_TTL_S:
            known = _keep(self._known, auth, (now, await self.gateway.images(auth)))
        return [i for i in self.images if i in known[1]]

    async def languages(self, image: str, auth: str) -> frozenset[str]:
        hit = self._probed.get((auth, image))
        if hit is not None and time.monotonic() - hit[0] < PROBE_TTL_S:
            return hit[1]
        async with self._lock:  # a burst of first calls probes once
            hit = self._probed.get((auth, image))
            if hit is not None and time.monotonic() - hit[0] < PROBE_TTL_S:
                return hit[1]
            req = FnCallRequest(language="bash", code=probe_script(), image=image,
                                memory_mb=DEFAULT_MEMORY_MB, disk_mb=DISK_MB, pids=PIDS,
                                timeout=60)
            out = await self.gateway.fncall(req, auth)
            if out.exit_code != 0:
                raise Internal(f"probing image {image!r} for its languages failed "
                                f"(exit {out.exit_code}): {out.stderr[-500:]}")
            langs = parse_probe(out.stdout)
            _keep(self._probed, (auth, image), (time.monotonic(), langs))
            return langs


CACHED = 1024  # callers (or caller and image pairs) remembered; past it, start over


def _keep(cache: dict, key, value):
    if len(cache) >= CACHED and key not in cache:
        cache.clear()
    cache[key] = value
    return value
