"""The API as tools see it: an OpenAPI document with one operation id per route, a
description each, the bearer scheme, and the error answers the server really gives (a bad
body is 400, as documented, not FastAPI's 422); /docs usable from a browser (no token to
load it, no CDN); JSON log lines carrying the request id."""

from __future__ import annotations

import json
import re

import httpx
import pytest

METHODS = ("get", "put", "post", "delete", "patch")


@pytest.fixture(scope="module")
def doc(server) -> dict:
    r = httpx.get(f"{server.url}/openapi.json",
                  headers={"authorization": f"Bearer {server.token}"}, timeout=30)
    assert r.status_code == 200
    return r.json()


def _operations(doc: dict):
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if method in METHODS:
                yield path, method, op


def test_one_operation_id_per_route_with_a_description(doc):
    ops = list(_operations(doc))
    ids = [op["operationId"] for _, _, op in ops]
    assert len(ids) == len(set(ids)) and len(ids) > 40
    for path, method, op in ops:
        assert re.fullmatch(r"[a-z]+_[a-z0-9_]+[a-z0-9]", op["operationId"]), op["operationId"]
        assert op.get("description"), f"{method.upper()} {path} has no description"
        assert op["operationId"].split("_")[0] in op["tags"]
        if path.startswith("/v1/"):  # dsec's own routes say more than their name
            assert op["description"] != op.get("summary"), f"{method.upper()} {path}"


def test_bearer_scheme_and_real_error_answers(doc):
    assert doc["components"]["securitySchemes"]["bearer"] == {
        **doc["components"]["securitySchemes"]["bearer"], "type": "http", "scheme": "bearer"}
    assert doc["security"] == [{"bearer": []}]
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    for path, method, op in _operations(doc):
        codes = set(op["responses"])
        assert "422" not in codes, (method, path)
        assert {"400", "401", "500"} <= codes, (method, path)
        if "{sb_id}" in path:
            assert {"404", "410", "503"} <= codes, (method, path)
        ref = op["responses"]["400"]["content"]["application/json"]["schema"]["$ref"]
        assert ref == "#/components/schemas/Error"


def test_request_models_carry_examples(doc):
    schemas = doc["components"]["schemas"]
    for name in ("SandboxSpec", "ExecRequest", "ProcessRequest", "FnCallRequest",
                 "TimeoutRequest"):
        assert schemas[name].get("examples"), name


def test_documented_statuses_are_the_ones_returned(server, doc):
    auth = {"authorization": f"Bearer {server.token}"}
    with httpx.Client(base_url=server.url, timeout=30) as http:
        bad = http.post("/v1/sandboxes", json={"memory_mb": "lots"}, headers=auth)
        unauth = http.get("/v1/sandboxes")
        missing = http.get("/v1/sandboxes/sb-0000-nope", headers=auth)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_argument"
    assert unauth.status_code == 401 and missing.status_code == 404
    ops = {(p, m): op for p, m, op in _operations(doc)}
    assert "400" in ops[("/v1/sandboxes", "post")]["responses"]
    assert "401" in ops[("/v1/sandboxes", "get")]["responses"]
    assert "404" in ops[("/v1/sandboxes/{sb_id}", "get")]["responses"]


def test_docs_load_without_a_token_and_without_a_cdn(server):
    with httpx.Client(base_url=server.url, timeout=30) as http:
        page = http.get("/docs")
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assets = re.findall(r'(?:src|href)="(/docs/assets/[^"]+)"', page.text)
        assert {"/docs/assets/swagger-ui-bundle.js", "/docs/assets/swagger-ui.css"} <= set(assets)
        assert "//cdn" not in page.text and "https://" not in page.text
        for a in assets:
            r = http.get(a)
            assert r.status_code == 200 and len(r.content) > 1000, a
        assert "SwaggerUIBundle" in http.get("/docs/assets/swagger-ui-bundle.js").text
        assert http.get("/openapi.json").status_code == 401  # the document still needs it
        assert http.get("/docs/../v1/sandboxes").status_code == 401


def test_log_lines_are_json_with_the_request_id(server):
    rid = "test-openapi-rid-7"
    r = httpx.get(f"{server.url}/v1/sandboxes/sb-0000-nope", timeout=30,
                  headers={"authorization": f"Bearer {server.token}", "x-request-id": rid})
    assert r.status_code == 404 and r.headers["x-request-id"] == rid
    assert httpx.get(f"{server.url}/healthz").headers["x-request-id"].startswith("req-")
    lines = [ln for ln in (server.state_dir / "server.log").read_text().splitlines()
             if ln.strip()]
    records = [json.loads(ln) for ln in lines]  # every line is one JSON object
    assert all("request_id" in rec and "level" in rec and "timestamp" in rec
               for rec in records)
    ours = [rec for rec in records if rec["request_id"] == rid]
    assert ours and ours[-1]["status"] == 404 and ours[-1]["path"] == "/v1/sandboxes/sb-0000-nope"


# What a client generator makes of the document (openapi-python-client, openapi-typescript):
# each check below is a class of problem one of them stumbled on.

def test_schema_names_are_plain_model_names(doc):
    """A generator names a class after each schema. Two models of one name became
    ``dsec__api__rl__AuditList`` and ``dsec__api__projects__AuditList``, and
    openapi-python-client dropped one ("Attempted to generate duplicate models")."""
    for name in doc["components"]["schemas"]:
        assert re.fullmatch(r"[A-Z][A-Za-z0-9]*", name), name
