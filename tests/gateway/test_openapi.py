"""The API as tools see it: an OpenAPI document with one operation id per route, a
description each, the bearer scheme, and the error answers the server really gives (a bad
body is 400, as documented, not FastAPI's 422); /docs usable from a browser (no token to
load it, no CDN); JSON log lines carrying the request id."""

from __future__ import annotations

import hashlib
import json
import os
import re

import httpx
import pytest

from dsec.api.errors import ERROR_TABLE

METHODS = ("get", "put", "post", "delete", "patch", "head")


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
        if method != "head":  # an answer to HEAD has no body
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


BINARY = {"type": "string", "format": "binary"}
# routes whose body is raw bytes, not JSON, and what they send or take
RAW_IN = {("/v1/sandboxes/{sb_id}/files", "put"): "application/octet-stream",
          ("/v1/sandboxes/{sb_id}/files/tar", "put"): "application/x-tar",
          ("/v1/blobs/{digest}", "put"): "application/octet-stream"}
RAW_OUT = {("/v1/sandboxes/{sb_id}/files", "get"): "application/octet-stream",
           ("/v1/sandboxes/{sb_id}/files/tar", "get"): "application/x-tar",
           ("/v1/sandboxes/{sb_id}/screenshot", "get"): "image/png",
           ("/v1/blobs/{digest}", "get"): "application/octet-stream",
           ("/v1/blobs/{digest}/chunks", "get"): "application/octet-stream"}


def test_every_body_is_described(doc):
    """A route that reads its body from the stream had no requestBody: the generated
    ``files_write`` had no parameter for the file's bytes (it wrote an empty file), and
    openapi-typescript typed the body ``never``. An answer without a schema came back as
    None (``files_read``), an ``image/png: {}`` one was left out of the client."""
    ops = {(p, m): op for p, m, op in _operations(doc)}
    for (path, method), media in RAW_IN.items():
        body = ops[(path, method)].get("requestBody")
        assert body and body["content"] == {media: {"schema": BINARY}}, (method, path, body)
    for (path, method), media in RAW_OUT.items():
        ok = ops[(path, method)]["responses"]["200"]
        assert ok["content"] == {media: {"schema": BINARY}}, (method, path, ok)
    for (path, method), op in ops.items():
        if method == "put":  # a PUT carries what it puts
            assert op.get("requestBody"), (method, path)
        for status, answer in op["responses"].items():
            if status == "204" or method == "head":
                assert not answer.get("content"), (method, path, status)
                continue
            assert answer.get("content"), (method, path, status)
            for media, described in answer["content"].items():
                assert described.get("schema"), (method, path, status, media)


def test_streamed_events_name_their_model(doc):
    """NDJSON answers: text, one ExecEvent per line; ExecEvent is in the document so a
    generated client has the model to parse each line with."""
    ops = {(p, m): op for p, m, op in _operations(doc)}
    for key in (("/v1/sandboxes/{sb_id}/exec/stream", "post"),
                ("/v1/sandboxes/{sb_id}/processes/{pid}/events", "get")):
        content = ops[key]["responses"]["200"]["content"]
        assert list(content) == ["application/x-ndjson"], key
        assert content["application/x-ndjson"]["schema"]["type"] == "string"
        assert "ExecEvent" in content["application/x-ndjson"]["schema"]["description"]
    assert doc["components"]["schemas"]["ExecEvent"]["properties"]["result"]


def test_documented_successes_are_the_ones_returned(server, doc):
    """The blob and manifest uploads answer 201; the document said 200, so a generated
    client took the answer for an unexpected status."""
    data = b"a blob pushed by test_openapi"
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    auth = {"authorization": f"Bearer {server.token}"}
    with httpx.Client(base_url=server.url, timeout=30, headers=auth) as http:
        put = http.put(f"/v1/blobs/{digest}", content=data)
        head = http.head(f"/v1/blobs/{digest}")
        got = http.get(f"/v1/blobs/{digest}")
    ops = {(p, m): op for p, m, op in _operations(doc)}
    for (path, method), r in {("/v1/blobs/{digest}", "put"): put,
                              ("/v1/blobs/{digest}", "head"): head,
                              ("/v1/blobs/{digest}", "get"): got}.items():
        assert str(r.status_code) in ops[(path, method)]["responses"], (method, path, r)
    assert [s for s in ops[("/v1/manifests/{name}", "put")]["responses"]
            if s.startswith("2")] == ["201"]
    assert put.json()["digest"] == digest and got.content == data


def test_only_dsec_own_api_is_documented(server, doc):
    """The SandboxFusion routes speak SandboxFusion's protocol: ``run_code`` reads a body
    the document did not show, and refuses one with SandboxFusion's 422 ``detail``, not
    the 400 ``error`` documented for it. Like the E2B routes they are for that project's
    client, and stay out of dsec's document."""
    assert all(path.startswith("/v1/") for path in doc["paths"]), list(doc["paths"])
    r = httpx.post(f"{server.url}/sandboxfusion/run_code", content=b"{",
                   headers={"authorization": f"Bearer {server.token}"}, timeout=30)
    assert r.status_code == 422 and "detail" in r.json()  # still served, as it was


def test_answers_are_named_models(doc):
    """An answer typed ``dict`` became a free-form object: openapi-python-client made
    ``FilesUploadTarResponseFilesUploadTar`` with nothing but ``additional_properties``."""
    for path, method, op in _operations(doc):
        for status, answer in op["responses"].items():
            schema = (answer.get("content") or {}).get("application/json", {}).get("schema")
            if schema is not None and schema.get("type") == "object":
                assert schema.get("properties"), (method, path, status, schema)


def test_refusals_of_any_route_are_documented(server, doc):
    """A token's role is checked on every route (403), and a project made twice is a 409:
    neither was documented, so a generated client took either for an unexpected status."""
    name = f"openapi-{os.getpid()}"
    with httpx.Client(base_url=server.url, timeout=30,
                      headers={"authorization": f"Bearer {server.token}"}) as http:
        viewer = http.post("/v1/projects/tokens", json={"role": "viewer", "ttl_s": 600})
        assert viewer.status_code == 201, viewer.text
        try:
            refused = http.post("/v1/sandboxes", json={}, headers={
                "authorization": f"Bearer {viewer.json()['token']}"})
        finally:
            http.post("/v1/projects/tokens/revoke", json={"token": viewer.json()["id"]})
        assert http.post("/v1/projects", json={"path": name}).status_code == 201
        try:
            again = http.post("/v1/projects", json={"path": name})
        finally:
            http.delete("/v1/projects", params={"path": name})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
    assert again.status_code == 409 and again.json()["error"]["code"] == "conflict"
    ops = {(p, m): op for p, m, op in _operations(doc)}
    assert "409" in ops[("/v1/projects", "post")]["responses"]
    for (path, method), op in ops.items():
        assert "403" in op["responses"], (method, path)
        if path.startswith("/v1/projects") and (method, path) != ("get", "/v1/projects"):
            assert "404" in op["responses"], (method, path)  # a project named by `path`


def test_answers_require_every_field_they_always_send(server, doc):
    """The server sends every field of an answer, defaults included; the document listed
    only the fields without a default as required, so openapi-python-client typed the
    others ``str | Unset`` (``ExecResult.stdout``, ``SandboxInfo.layers``), and
    openapi-typescript made them optional. A request keeps its defaulted fields
    optional."""
    schemas = doc["components"]["schemas"]
    for name in ("SandboxInfo", "ExecResult", "ExecEvent", "FileInfo", "SandboxList"):
        assert set(schemas[name]["required"]) == set(schemas[name]["properties"]), name
    for name in ("SandboxSpec", "ExecRequest"):
        assert schemas[name].get("required", []) == (["cmd"] if name == "ExecRequest" else [])
    auth = {"authorization": f"Bearer {server.token}"}
    with httpx.Client(base_url=server.url, timeout=60, headers=auth) as http:
        sb = http.post("/v1/sandboxes", json={"memory_mb": 64}).json()
        try:
            answers = {"SandboxInfo": http.get(f"/v1/sandboxes/{sb['id']}").json(),
                       "ExecResult": http.post(f"/v1/sandboxes/{sb['id']}/exec",
                                               json={"cmd": "true"}).json(),
                       "SandboxList": http.get("/v1/sandboxes").json()}
        finally:
            http.delete(f"/v1/sandboxes/{sb['id']}")
    for name, body in answers.items():
        assert set(schemas[name]["required"]) <= set(body), (name, body)


def test_a_collection_and_its_items_share_a_tag(doc):
    """A generator groups operations by tag (openapi-python-client: one package each):
    listing images was ``api.sandboxes.sandboxes_images`` while removing one was
    ``api.images.images_remove_image``."""
    tags = {}
    for path, method, op in _operations(doc):
        tags.setdefault(re.sub(r"/\{[^}]+\}$", "", path), set()).add(op["tags"][0])
    mixed = {path: got for path, got in tags.items() if len(got) > 1}
    assert not mixed, mixed


def test_the_description_says_what_generators_need(doc):
    """What the document cannot say in its own terms: the WebSocket route, and the two
    generator settings that a client of these answers and requests needs."""
    text = doc["info"]["description"]
    for needed in ("/v1/sandboxes/{sb_id}/pty", "content_type_overrides",
                   "--default-non-nullable false"):
        assert needed in text, needed


def test_the_error_shape_is_named_schemas(doc):
    """The error answer's inner object and its code were anonymous: openapi-python-client
    named them ``ErrorError`` and ``ErrorErrorCode``. They are ``ErrorDetail`` and
    ``ErrorCode``, the codes of the error table."""
    schemas = doc["components"]["schemas"]
    ref = "#/components/schemas/"
    assert schemas["Error"]["properties"]["error"] == {"$ref": ref + "ErrorDetail"}
    assert schemas["ErrorDetail"]["properties"]["code"] == {"$ref": ref + "ErrorCode"}
    assert set(schemas["ErrorCode"]["enum"]) == set(ERROR_TABLE)


def test_no_parameter_a_gateway_ignores(doc):
    """The files routes' ``grading`` is how a gateway tells a node's own API; a gateway
    ignores it (the token's role decides), yet every generated files method offered it."""
    for path, method, op in _operations(doc):
        names = {p["name"] for p in op.get("parameters", [])}
        assert "grading" not in names, (method, path)
