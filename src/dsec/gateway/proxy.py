"""The gateway of a multi-machine cluster: place, then relay to the node's own HTTP API.

Stateless: node agents are found through the cluster (Ray), a sandbox's node is read off
its id, and request and response bodies are streamed through, so files of any size and
NDJSON exec streams pass without being held. The interactive terminal is relayed as a
WebSocket. Requests that concern every node (lists, jobs) fan out and merge.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.background import BackgroundTask

from dsec.api.errors import Capacity
from dsec.api.models import CreateManyRequest, SandboxSpec, validated_json
from dsec.cluster.ray import NodeEndpoint, RayCluster
from dsec.gateway.auth import BearerAuth
from dsec.gateway.guard import RequestGuard, install_error_handlers
from dsec.placement.choose import choose_node, refusal

__all__ = ["create_proxy_app"]

HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


def create_proxy_app(cluster: RayCluster, token: str) -> FastAPI:
    http = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0),
                             limits=httpx.Limits(max_connections=1024))
    recent: Counter[str] = Counter()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await http.aclose()

    app = FastAPI(title="dsec gateway", lifespan=lifespan, openapi_url=None)

    install_error_handlers(app)

    async def forward(request: Request, base: str, path: str | None = None,
                      body: bytes | None = None) -> Response:
        url = base + (path or request.url.path)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        content = body if body is not None else request.stream()
        req = http.build_request(request.method, url, params=request.query_params,
                                 headers=headers, content=content)
        resp = await http.send(req, stream=True)
        out_headers = {k: v for k, v in resp.headers.items() if k.lower() not in HOP_HEADERS}
        return StreamingResponse(resp.aiter_raw(), status_code=resp.status_code,
                                 headers=out_headers, background=BackgroundTask(resp.aclose))

    async def fan_out(request: Request, body: bytes | None = None) -> list[httpx.Response]:
        nodes = list((await cluster.endpoints()).values())
        headers = {"authorization": request.headers.get("authorization", "")}
        if body is not None:
            headers["content-type"] = "application/json"
        return await asyncio.gather(*(
            http.request(request.method, n.url + request.url.path,
                         params=request.query_params, headers=headers, content=body)
            for n in nodes))

    async def place(spec: SandboxSpec, count: int, exclude: frozenset[str]) -> NodeEndpoint:
        pairs = await cluster.loads()
        by_id = {load.node_id: ep for ep, load in pairs}
        chosen = choose_node([load for _, load in pairs], spec.backend, spec.memory_mb * count,
                             spec.cpu * count, recent=recent, rng=random.Random(),
                             exclude=exclude)
        if chosen is None:
            raise Capacity(refusal([load for _, load in pairs], spec.backend, spec.memory_mb,
                                   spec.cpu, count, exclude=exclude))
        recent[chosen.node_id] += count
        return by_id[chosen.node_id]

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict:
        return {"ok": True, "nodes": len(await cluster.endpoints())}

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi(request: Request) -> Response:
        nodes = list((await cluster.endpoints()).values())
        if not nodes:
            return JSONResponse({"openapi": "3.1.0", "info": {"title": "dsec"}, "paths": {}})
        return await forward(request, nodes[0].url)

    @app.post("/v1/sandboxes")
    async def create(request: Request) -> Response:
        body = await request.body()
        spec = validated_json(SandboxSpec, body)
        tried: set[str] = set()
        while True:  # the node's admission has the last word: on "full", try another
            ep = await place(spec, 1, frozenset(tried))
            resp = await http.post(ep.url + "/v1/sandboxes", content=body,
                                   headers={"authorization": request.headers["authorization"],
                                            "content-type": "application/json"})
            if resp.status_code != 503:
                return Response(resp.content, resp.status_code,
                                media_type="application/json")
            tried.add(ep.node_id)

    @app.post("/v1/sandboxes/batch")
    async def create_many(request: Request) -> JSONResponse:
        req = validated_json(CreateManyRequest, await request.body())
        shares: Counter[str] = Counter()
        eps: dict[str, NodeEndpoint] = {}
        for _ in range(req.count):  # spread the batch: each unit placed like a single create
            ep = await place(req.spec, 1, frozenset())
            shares[ep.node_id] += 1
            eps[ep.node_id] = ep
        headers = {"authorization": request.headers["authorization"]}
        results = await asyncio.gather(*(
            http.post(eps[n].url + "/v1/sandboxes/batch", headers=headers,
                      json=CreateManyRequest(count=c, spec=req.spec).model_dump())
            for n, c in shares.items()))
        made, errors = [], []
        for r in results:
            if r.status_code < 400:
                made += r.json()["sandboxes"]
                errors += r.json()["errors"]
            else:
                errors.append(r.text)
        return JSONResponse({"sandboxes": made, "errors": errors}, status_code=201)

    @app.get("/v1/sandboxes")
    async def list_sandboxes(request: Request) -> JSONResponse:
        out = []
        for r in await fan_out(request):
            if r.status_code == 200:
                out += r.json()["sandboxes"]
        return JSONResponse({"sandboxes": out})

    @app.get("/v1/nodes")
    async def nodes(request: Request) -> JSONResponse:
        out = []
        for r in await fan_out(request):
            if r.status_code == 200:
                out += r.json()
        return JSONResponse(out)

    @app.api_route("/v1/jobs{rest:path}", methods=["GET", "POST", "DELETE"])
    async def jobs(request: Request, rest: str) -> Response:
        from dsec.api.rl import JobInfo, JobList
        from dsec.rl.jobs import merge_job_infos
        body = await request.body() if request.method == "POST" else None
        rs = [r for r in await fan_out(request, body) if r.status_code < 400]
        if request.method == "DELETE":
            return Response(status_code=204)
        if rest in ("", "/"):
            merged = merge_job_infos([JobList.model_validate(r.json()).jobs for r in rs])
            return JSONResponse(JobList(jobs=merged).model_dump(mode="json"))
        infos = merge_job_infos([[JobInfo.model_validate(r.json())] for r in rs])
        if not infos:
            return JSONResponse({"error": {"code": "not_found",
                                           "message": f"job {rest.strip('/')} not found"}}, 404)
        return JSONResponse(infos[0].model_dump(mode="json"))

    @app.api_route("/v1/images{rest:path}", methods=["GET"])
    async def images(request: Request, rest: str) -> Response:
        nodes = list((await cluster.endpoints()).values())
        return await forward(request, nodes[0].url)

    @app.api_route("/v1/sandboxes/{sb_id}{rest:path}",
                   methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    async def relay(request: Request, sb_id: str, rest: str) -> Response:
        ep = await cluster.endpoint_for(sb_id)
        return await forward(request, ep.url)

    @app.api_route("/v1/{rest:path}", methods=["GET", "POST", "PUT", "DELETE"])
    async def other(request: Request, rest: str) -> Response:
        """Node-independent routes (e.g. fncall): any node with room serves them."""
        pairs = await cluster.loads()
        ep = min(pairs, key=lambda p: p[1].sandboxes)[0]
        return await forward(request, ep.url)

    @app.websocket("/v1/sandboxes/{sb_id}/pty")
    async def pty(ws: WebSocket, sb_id: str) -> None:
        import websockets
        ep = await cluster.endpoint_for(sb_id)
        target = ep.url.replace("http", "ws", 1) + ws.url.path
        if ws.url.query:
            target += "?" + ws.url.query
        await ws.accept()
        auth = ws.headers.get("authorization", "")
        async with websockets.connect(target, additional_headers={"authorization": auth}) as up:
            async def down() -> None:
                async for msg in up:
                    if isinstance(msg, bytes):
                        await ws.send_bytes(msg)
                    else:
                        await ws.send_text(msg)

            task = asyncio.create_task(down())
            try:
                while True:
                    msg = await ws.receive()
                    if msg["type"] == "websocket.disconnect":
                        break
                    await up.send(msg["bytes"] if msg.get("bytes") is not None else msg["text"])
            finally:
                task.cancel()
        try:
            await ws.close()
        except RuntimeError:
            pass

    app.add_middleware(RequestGuard)
    app.add_middleware(BearerAuth, token=token)
    return app
