"""The OpenAPI document as clients need it, and a /docs page that works offline.

FastAPI's own document names operations after their paths, documents a 422 the gateway
never sends (a bad request is ``400 invalid_argument``), and declares no auth. Here:
one operation id per route (``<router>_<function>``), a description for each, the bearer
scheme, and the error answers the gateway really gives, in its one error shape. ``/docs``
serves Swagger UI from files installed with the server (fastapi-offline ships them), and
asks for the token in the page, since a browser cannot send a bearer header itself.
"""

from __future__ import annotations

import json
from importlib import resources

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute

from dsec.api.errors import ERROR_TABLE
from dsec.api.models import ExecEvent

__all__ = ["operation_id", "install_openapi", "DocsPages", "BINARY", "raw_body", "raw_answer",
           "ndjson_answer"]

# Bytes, not JSON: openapi-python-client makes it a File, openapi-typescript a string.
BINARY = {"type": "string", "format": "binary"}


def raw_body(media_type: str) -> dict:
    """``openapi_extra`` of a route that reads its body as a byte stream: FastAPI sees no
    body parameter, so without this a generated client has no way to send the bytes."""
    return {"requestBody": {"required": True, "content": {media_type: {"schema": BINARY}}}}


def raw_answer(media_type: str, what: str, status: int = 200) -> dict:
    """``responses`` of a route that answers bytes of ``media_type``."""
    return {status: {"description": what, "content": {media_type: {"schema": BINARY}}}}


def ndjson_answer(what: str) -> dict:
    """``responses`` of a route that streams ExecEvent lines. OpenAPI 3.1 cannot name the
    schema of each line (3.2's ``itemSchema``): the description does, and the document
    carries ExecEvent for a client to parse lines with."""
    return {200: {"description": what, "content": {"application/x-ndjson": {"schema": {
        "type": "string", "description": "one JSON object per line, each an ExecEvent "
                                         "(#/components/schemas/ExecEvent)"}}}}}

# Routes whose function has no docstring: what they do, as /docs shows it.
DESCRIPTIONS = {
    "sandboxes_list_sandboxes": "Sandboxes of every healthy node, filtered by `job` and by "
                                "`label=key=value` (all must match); `unreachable` names "
                                "the nodes that did not answer.",
    "sandboxes_get": "One sandbox, with the memory it holds now.",
    "sandboxes_stop": "Stop the sandbox and remove everything it had (idempotent for a "
                      "sandbox that already expired).",
    "sandboxes_pause": "Freeze every process; files and memory stay. Any later request "
                       "resumes it.",
    "sandboxes_resume": "Thaw a paused sandbox.",
    "sandboxes_exec": "Run a command to completion: exit code, output (capped at "
                      "`max_output` per stream, `*_truncated` says so), timing. A non-zero "
                      "exit, a timeout or an OOM kill is a result, not an error.",
    "sandboxes_shell_open": "Open a shell session: its cwd and exported variables persist "
                            "between runs.",
    "sandboxes_shell_run": "Run one line in a shell session; on timeout the command is "
                           "killed and the shell lives.",
    "sandboxes_shell_close": "End a shell session.",
    "sandboxes_pack_diff": "Turn the sandbox's writable layer into a new layer over its "
                           "image, tagged `tag`.",
    "images_list_images": "Images (tags) the cluster's nodes know.",
    "sandboxes_nodes": "Nodes of the cluster with their load.",
    "files_read": "The file's bytes (streamed).",
    "files_write": "Create or replace a file with the request body (streamed; bounded by "
                   "the sandbox's `disk_mb` and `memory_mb`).",
    "files_remove": "Remove a file, or a directory with `recursive=true`.",
    "files_stat": "Type, size, mode and mtime of a path.",
    "files_list_dir": "Entries of a directory.",
    "files_mkdir": "Make a directory (and its parents with `parents=true`).",
    "files_download_tar": "A tar stream of a path.",
    "files_upload_tar": "Unpack a tar body into a directory; hostile entries are refused "
                        "by name.",
    "fncall_fncall": "Run code (or a pickled callable) once in a clean, pooled, isolated "
                     "worker.",
    "fncall_fncall_batch": "Many fncalls in one request, run concurrently; results in "
                           "order.",
    "jobs_list_jobs": "Every job with sandboxes or a lease: counts by state and usage.",
    "jobs_get_job": "One job.",
    "jobs_stop": "Stop every sandbox of the job and drop its lease.",
    "jobs_pause": "Freeze every sandbox of the job; any request resumes that one.",
    "jobs_resume": "Thaw every paused sandbox of the job.",
    "jobs_heartbeat": "Renew the job's lease: without one for `lease_s` the job is paused, "
                      "`stop_after_s` later stopped.",
    "network_get_network": "Egress permissions, and what was refused so far.",
    "network_put_network": "Change egress permissions while the sandbox runs.",
    "trajectory_trajectory": "The sandbox's ordered log of mutating calls and their "
                             "results.",
    "trajectory_audit": "Actions the sandbox was refused: network destinations, divergent "
                        "replays.",
    "blobs_get_blob": "A layer blob of this node's store, whole (what another node's lazy "
                      "loader or `dsec image push` reads).",
    "blobs_get_chunks": "Verified chunks of a layer blob, for on-demand loading.",
    "blobs_head_blob": "Whether the store has a blob (`dsec image push` skips it if so).",
    "blobs_put_blob": "Upload a layer blob; its digest is checked.",
    "blobs_put_manifest": "Upload a manifest and tag it; every layer it names must be here.",
    "blobs_get_manifest": "A manifest by tag or digest.",
}

_ERRORS = {  # status -> (when, example code)
    400: ("the request is malformed or a value is out of range; the message names the "
          "field and what to change", "invalid_argument"),
    401: ("missing or wrong bearer token", "unauthorized"),
    403: ("the token's role or project may not do this; the message names what it needs",
          "forbidden"),
    404: ("no such sandbox, shell, process, job, image or path", "not_found"),
    409: ("the request conflicts with the current state (the sandbox's; a project that "
          "exists already or is not empty)", "conflict"),
    410: ("the sandbox was stopped or expired (the message says which)", "stopped"),
    413: ("the JSON body is over `limits.body_bytes`", "too_large"),
    429: ("no node has room now (see `Retry-After`)", "capacity"),
    500: ("an unexpected failure on the server; the message says where", "internal"),
    503: ("the node holding the sandbox does not answer (`node_lost`), or no node does "
          "(`unavailable`)", "node_lost"),
    504: ("the operation ran past its timeout", "timeout"),
}


def operation_id(route) -> str:
    """``<tag>_<function name>``: the app's operation id for every route, those of
    routers other modules include (an integration's) too."""
    tag = (route.tags or ["gateway"])[0]
    return f"{tag}_{route.name.rstrip('_')}"


def _statuses(path: str, method: str, has_body: bool) -> list[int]:
    out = [400, 401, 403, 500]  # 403: every route checks the token's role
    projects = path.startswith("/v1/projects")
    if "{" in path or (projects and (path, method) != ("/v1/projects", "get")):
        out += [404]  # what the path names; a project named by the `path` parameter
    if "{sb_id}" in path:
        out += [409, 410]
    if path == "/v1/projects" and method in ("post", "delete"):
        out += [409]
    if not projects or (path, method) == ("/v1/projects", "delete"):  # reaches a node
        out += [503]
    if has_body:
        out += [413]
    if method == "post" and path in ("/v1/sandboxes", "/v1/sandboxes/batch", "/v1/fncall",
                                     "/v1/fncall/batch"):
        out += [429]
    if path.endswith(("/exec", "/run", "/wait")) or path.startswith("/v1/fncall"):
        out += [504]
    return sorted(set(out))


def _error_schemas() -> dict:
    """The one error shape, each part a named schema (a generator names anonymous ones
    after their place: ``ErrorError``, ``ErrorErrorCode``)."""
    return {
        "Error": {"type": "object", "required": ["error"], "properties": {
            "error": {"$ref": "#/components/schemas/ErrorDetail"}}},
        "ErrorDetail": {"type": "object", "required": ["code", "message"], "properties": {
            "code": {"$ref": "#/components/schemas/ErrorCode"},
            "message": {"type": "string",
                        "description": "what went wrong and what to change"}}},
        "ErrorCode": {"type": "string", "enum": sorted(ERROR_TABLE),
                      "description": "one per exception of dsec's error table"}}


def _document(app: FastAPI) -> dict:
    doc = get_openapi(title=app.title, version=app.version, description=app.description,
                      routes=app.routes)
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    schemas.update(_error_schemas())
    _add_model(schemas, ExecEvent)  # named by the NDJSON answers, referenced by none
    doc["components"]["securitySchemes"] = {"bearer": {
        "type": "http", "scheme": "bearer",
        "description": "the server's API token: `$STATE_DIR/token`, or `DSEC_TOKEN`"}}
    doc["security"] = [{"bearer": []}]
    for path, item in doc.get("paths", {}).items():
        for method, op in item.items():
            op.setdefault("tags", [op["operationId"].split("_")[0]])  # as its id says
            if not op.get("description"):  # a route without a docstring
                op["description"] = DESCRIPTIONS.get(op.get("operationId"),
                                                     op.get("summary", ""))
            responses = op.setdefault("responses", {})
            responses.pop("422", None)
            for status in _statuses(path, method, "requestBody" in op):
                responses.setdefault(str(status), _error_answer(status, method))
    _answers_send_every_field(doc)
    return doc


def _answers_send_every_field(doc: dict) -> None:
    """Every property of a schema only answers use is required: the server sends every
    field of a model, defaults included, and a generator types a field that may be absent
    as such (``str | Unset``, ``stdout?: string``). A schema requests use as well keeps
    its defaulted fields optional, as a request may leave them out."""
    schemas = doc["components"]["schemas"]
    asked, answered = set(), set()
    for item in doc["paths"].values():
        for op in item.values():
            _refs(schemas, [op.get("requestBody"), op.get("parameters")], asked)
            _refs(schemas, op.get("responses"), answered)
    _refs(schemas, {"$ref": "#/components/schemas/ExecEvent"}, answered)  # NDJSON lines
    for name in answered - asked:
        if props := schemas[name].get("properties"):
            schemas[name]["required"] = list(props)


def _refs(schemas: dict, node, seen: set[str]) -> None:
    """Add to ``seen`` the schemas ``node`` refers to, directly or through others."""
    if isinstance(node, list):
        for item in node:
            _refs(schemas, item, seen)
    elif isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
            name = ref.rsplit("/", 1)[1]
            if name not in seen:
                seen.add(name)
                _refs(schemas, schemas.get(name), seen)
        for value in node.values():
            _refs(schemas, value, seen)


def _error_answer(status: int, method: str) -> dict:
    when, code = _ERRORS[status]
    if method == "head":  # an answer to HEAD has no body
        return {"description": when}
    return {"description": when, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/Error"},
        "example": {"error": {"code": code, "message": when}}}}}


def _add_model(schemas: dict, model) -> None:
    """``model``'s schema, and those it refers to, among the document's schemas."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}",
                                     mode="serialization")
    for name, sub in schema.pop("$defs", {}).items():
        schemas.setdefault(name, sub)
    schemas.setdefault(model.__name__, schema)


def install_openapi(app: FastAPI) -> None:
    """Replace ``app.openapi`` with the document described above (built once)."""
    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = _document(app)
        return app.openapi_schema
    app.openapi = openapi  # type: ignore[method-assign]
    for route in app.routes:  # /healthz (no token) and /metrics are not API operations
        if isinstance(route, APIRoute) and route.path in ("/healthz", "/metrics"):
            route.include_in_schema = False


_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>dsec API</title>
<link rel="stylesheet" href="/docs/assets/swagger-ui.css">
<link rel="icon" href="/docs/assets/favicon.png"></head>
<body><div id="token" style="font-family:sans-serif;margin:1em;display:none">
<form onsubmit="useToken(this.t.value);return false">API token (the server's
<code>$STATE_DIR/token</code>, or DSEC_TOKEN): <input name="t" type="password" size="50">
<button>Open</button></form></div><div id="ui"></div>
<script src="/docs/assets/swagger-ui-bundle.js"></script>
<script>
// A browser cannot add a bearer header to a page load: the page asks for the token
// (or takes it from #token=... in the address), keeps it for this tab, and adds it to
// every request it makes, the document's own first.
function useToken(t) {
  sessionStorage.setItem("dsecToken", t);
  document.getElementById("token").style.display = "none";
  SwaggerUIBundle({url: "/openapi.json", dom_id: "#ui", persistAuthorization: true,
    requestInterceptor: function (req) {
      req.headers["Authorization"] = "Bearer " + sessionStorage.getItem("dsecToken");
      return req;
    }});
}
var m = location.hash.match(/token=([^&]+)/);
if (m) { sessionStorage.setItem("dsecToken", decodeURIComponent(m[1]));
         history.replaceState(null, "", location.pathname); }
if (sessionStorage.getItem("dsecToken")) { useToken(sessionStorage.getItem("dsecToken")); }
else { document.getElementById("token").style.display = "block"; }
</script></body></html>
"""

_ASSETS = {"swagger-ui.css": "text/css", "swagger-ui-bundle.js": "text/javascript",
           "favicon.png": "image/png"}


class DocsPages:
    """ASGI middleware outside the bearer check: ``/docs`` and its assets need no token
    (they hold nothing of the server's; the document they load does need it)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if scope["type"] != "http" or not (path == "/docs" or path.startswith("/docs/")):
            return await self.app(scope, receive, send)
        name = path.removeprefix("/docs/assets/")
        if path == "/docs":
            body, ctype = _PAGE.encode(), "text/html; charset=utf-8"
        elif name in _ASSETS and (data := _asset(name)) is not None:
            body, ctype = data, _ASSETS[name]
        else:
            body = json.dumps({"error": {"code": "not_found", "message":
                                         f"{path}: no such page (the API docs are at "
                                         "/docs)"}}).encode()
            await _answer(send, 404, "application/json", body)
            return
        await _answer(send, 200, ctype, body)


def _asset(name: str) -> bytes | None:
    try:
        return (resources.files("fastapi_offline") / "static" / name).read_bytes()
    except (ModuleNotFoundError, FileNotFoundError):
        return None


async def _answer(send, status: int, ctype: str, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", ctype.encode()),
                            (b"content-length", str(len(body)).encode()),
                            (b"cache-control", b"no-store" if status != 200 or
                             ctype.startswith("text/html") else b"max-age=86400")]})
    await send({"type": "http.response.body", "body": body})
