"""HTTP-level behaviour: auth, errors, OpenAPI, metrics."""

import httpx
import pytest

import dsec


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=60,
                      headers={"authorization": f"Bearer {server.token}"}) as c:
        yield c


def test_health_is_open(server):
    assert httpx.get(f"{server.url}/healthz").status_code == 200


@pytest.mark.parametrize("path", ["/v1/sandboxes", "/v1/sandboxes/sb-x-1", "/openapi.json",
                                  "/metrics"])
@pytest.mark.parametrize("token", [None, "wrong"])
def test_wrong_or_missing_token_is_401_with_no_hint(server, path, token):
    headers = {"authorization": f"Bearer {token}"} if token else {}
    r = httpx.get(f"{server.url}{path}", headers=headers)
    assert r.status_code == 401
    assert r.json() == {"error": {"code": "unauthorized",
                                  "message": "missing or wrong bearer token"}}


def test_unknown_sandbox_404(http):
    r = http.get("/v1/sandboxes/sb-deadbeef-000000000000")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def test_malformed_json_is_400(http):
    r = http.post("/v1/sandboxes", content=b"{not json",
                  headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_argument"


def test_out_of_range_memory_says_what_to_change(http):
    r = http.post("/v1/sandboxes", json={"memory_mb": 4})
    assert r.status_code == 400
    assert "memory_mb must be between 16 and 65536; got 4" in r.json()["error"]["message"]


async def test_unknown_image_is_not_found(client):
    with pytest.raises(dsec.NotFound, match="no-such-image"):
        await client.create(image="no-such-image:1")


async def test_unsupported_backend_is_clear(client):
    with pytest.raises((dsec.Unsupported, dsec.Capacity), match="vm"):
        await client.create(backend="vm")


def test_openapi_lists_the_routes(http):
    paths = http.get("/openapi.json").json()["paths"]
    for p in ("/v1/sandboxes", "/v1/sandboxes/{sb_id}/exec", "/v1/sandboxes/{sb_id}/files"):
        assert p in paths


async def test_metrics_count_sandboxes_and_execs(client, http):
    sb = await client.create(memory_mb=64)
    try:
        await sb.exec("true")
        text = http.get("/metrics").text
        assert 'dsec_sandboxes{state="running"}' in text
        assert "dsec_sandbox_creations_total" in text and "dsec_exec_seconds_bucket" in text
    finally:
        await sb.stop()
