"""The request guard and error handlers on a small app of their own (no node needed)."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI, Request

from dsec.api import limits
from dsec.api.models import SandboxSpec
from dsec.gateway.guard import RequestGuard, install_error_handlers


@pytest.fixture
def app():
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/boom")
    async def boom():
        raise KeyError("secret detail")

    @app.post("/v1/sandboxes")
    async def create(spec: SandboxSpec) -> dict:
        return {"labels": len(spec.labels)}

    @app.put("/v1/sandboxes/{sb_id}/files")
    async def upload(request: Request, sb_id: str) -> dict:
        return {"bytes": sum([len(c) async for c in request.stream()])}

    app.add_middleware(RequestGuard)
    return app


@pytest.fixture
async def http(app):
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        yield c


@pytest.fixture
def small_body():
    limits.configure(limits.RequestLimits(body_bytes=1 << 16))
    yield 1 << 16
    limits.configure(limits.DEFAULT_LIMITS)


async def test_an_unexpected_exception_is_a_structured_internal_error(http):
    r = await http.get("/boom")
    assert r.status_code == 500
    err = r.json()["error"]
    assert err["code"] == "internal" and "GET /boom" in err["message"]
    assert "KeyError" in err["message"] and "secret detail" not in err["message"]


async def test_an_unknown_route_has_the_error_shape(http):
    r = await http.get("/nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


async def test_nul_in_a_query_parameter_is_named(http):
    r = await http.get("/boom", params={"path": "a\0b"})
    assert r.status_code == 400 and "'path'" in r.json()["error"]["message"]


async def test_a_body_past_the_limit_is_413_by_its_length(http, small_body):
    r = await http.post("/v1/sandboxes", content=b"x" * (small_body + 1),
                        headers={"content-type": "application/json"})
    assert r.status_code == 413 and "limits.body_bytes" in r.json()["error"]["message"]


async def test_a_chunked_body_past_the_limit_is_413(http, small_body):
    async def chunks():
        for _ in range(4):
            yield b"x" * small_body
    r = await http.post("/v1/sandboxes", content=chunks(),
                        headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "too_large"


async def test_a_body_within_the_limit_passes(http, small_body):
    r = await http.post("/v1/sandboxes", json={"labels": {"a": "b"}})
    assert r.status_code == 200 and r.json() == {"labels": 1}


async def test_a_file_upload_is_not_held_to_the_json_limit(http, small_body):
    r = await http.put("/v1/sandboxes/sb-1/files", content=b"x" * (4 * small_body))
    assert r.status_code == 200 and r.json() == {"bytes": 4 * small_body}
