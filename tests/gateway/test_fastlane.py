"""The fast lane answers its hot routes as FastAPI's router does, and hands on the rest.

Two gateway apps over simulated nodes (a real NodeService with its SQLite store and
trajectory log; the simulated backend runs no process, so no root resources are used):
one as built, one with the lane taken out, fed the same requests in process.
"""

from __future__ import annotations

import httpx
import pytest
from fastapi import APIRouter, Request

from dsec.cluster.local import LocalCluster
from dsec.gateway import fastlane
from dsec.gateway.app import create_app
from dsec.gateway.fastlane import FastLane, _Plan, hot
from dsec.node.backends.simulated import open_simulated_node

TOKEN = "dsec_fastlane-test-token"
SPEC = {"memory_mb": 64, "cpu": 0.05}


async def _gateway(tmp_path, name: str, lane: bool):
    node = await open_simulated_node(tmp_path / name)
    app = create_app(LocalCluster(node), TOKEN)
    if not lane:  # the router the lane stands in front of
        app.router.middleware_stack = app.router.middleware_stack.app
    return app, node


@pytest.fixture
async def pair(tmp_path):
    """``(with lane, without lane)`` httpx clients, each with one sandbox made."""
    out = []
    async with _Both(tmp_path) as both:
        for app in both.apps:
            c = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t",
                                  headers={"authorization": f"Bearer {TOKEN}"})
            r = await c.post("/v1/sandboxes", json=SPEC)
            assert r.status_code == 201, r.text
            out.append((c, r.json()["id"]))
        yield out
        for c, _ in out:
            await c.aclose()


class _Both:
    def __init__(self, tmp_path) -> None:
        self.tmp_path = tmp_path

    async def __aenter__(self):
        self.made = [await _gateway(self.tmp_path, "fast", True),
                     await _gateway(self.tmp_path, "slow", False)]
        self.apps = [a for a, _ in self.made]
        self.ctx = [a.router.lifespan_context(a) for a in self.apps]
        for c in self.ctx:
            await c.__aenter__()
        return self

    async def __aexit__(self, *exc):
        for (app, node), c in zip(self.made, self.ctx):
            for sb in list(node.records):
                await node.stop(sb)
            await c.__aexit__(None, None, None)
        return False


def _same(a: httpx.Response, b: httpx.Response, sb_ids: tuple[str, str]) -> None:
    assert a.status_code == b.status_code, (a.text, b.text)
    assert a.headers.get("content-type") == b.headers.get("content-type")
    assert a.headers.get("location") == b.headers.get("location")
    assert "x-request-id" in a.headers and "x-request-id" in b.headers
    ta, tb = a.text.replace(sb_ids[0], "SB"), b.text.replace(sb_ids[1], "SB")
    if a.status_code < 300 and a.headers.get("content-type") == "application/json":
        ka, kb = a.json(), b.json()  # ids, times and durations differ between the two
        assert sorted(ka) == sorted(kb)
    else:
        assert ta == tb


CASES = [
    ("exec", "POST", "/v1/sandboxes/{sb}/exec", {"json": {"cmd": ["true"]}}),
    ("exec exit 1", "POST", "/v1/sandboxes/{sb}/exec", {"json": {"cmd": "false"}}),
    ("exec unknown field", "POST", "/v1/sandboxes/{sb}/exec",
     {"json": {"cmd": ["true"], "nope": 1}}),
    ("exec missing cmd", "POST", "/v1/sandboxes/{sb}/exec", {"json": {}}),
    ("exec not JSON", "POST", "/v1/sandboxes/{sb}/exec",
     {"content": b"{cmd", "headers": {"content-type": "application/json"}}),
    ("exec text body", "POST", "/v1/sandboxes/{sb}/exec",
     {"content": b'{"cmd": ["true"]}', "headers": {"content-type": "text/plain"}}),
    ("exec no body", "POST", "/v1/sandboxes/{sb}/exec", {}),
    ("exec unsupported command", "POST", "/v1/sandboxes/{sb}/exec", {"json": {"cmd": "ls"}}),
    ("exec unknown sandbox", "POST", "/v1/sandboxes/sb-nope/exec", {"json": {"cmd": "true"}}),
    ("get", "GET", "/v1/sandboxes/{sb}", {}),
    ("get unknown", "GET", "/v1/sandboxes/sb-nope", {}),
    ("create", "POST", "/v1/sandboxes", {"json": SPEC}),
    ("create too little memory", "POST", "/v1/sandboxes", {"json": {"memory_mb": 4}}),
    ("create trailing slash", "POST", "/v1/sandboxes/", {"json": SPEC}),
    ("shell run unsupported", "POST", "/v1/sandboxes/{sb}/shells/sh-x/run",
     {"json": {"cmd": "true"}}),
]


@pytest.mark.parametrize("name,method,path,kw", CASES, ids=[c[0] for c in CASES])
async def test_a_hot_route_answers_as_the_router_does(pair, name, method, path, kw):
    (fast, sb_fast), (slow, sb_slow) = pair
    a = await fast.request(method, path.format(sb=sb_fast), **kw)
    b = await slow.request(method, path.format(sb=sb_slow), **kw)
    _same(a, b, (sb_fast, sb_slow))


async def test_hot_requests_are_counted_by_their_route_template(pair):
    (fast, sb), _ = pair
    assert (await fast.post(f"/v1/sandboxes/{sb}/exec", json={"cmd": "true"})).status_code == 200
    text = (await fast.get("/metrics")).text
    line = next(ln for ln in text.splitlines() if ln.startswith("dsec_gateway_requests_total{")
                and 'route="/v1/sandboxes/{sb_id}/exec"' in ln and 'status="200"' in ln)
    assert float(line.rsplit(" ", 1)[1]) >= 1


async def test_a_wrong_token_is_refused_before_the_lane(pair):
    (fast, sb), _ = pair
    r = await fast.post(f"/v1/sandboxes/{sb}/exec", json={"cmd": "true"},
                        headers={"authorization": "Bearer wrong"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"


async def test_each_hot_path_is_the_route_the_router_picks(tmp_path):
    """No route before a hot one in the table matches its paths (the lane is asked first)."""
    app, node = await _gateway(tmp_path, "n", True)
    lane = app.router.middleware_stack
    assert isinstance(lane, FastLane)
    plans = [p for ps in lane.by_method.values() for p in ps]
    assert {p.route.endpoint.__name__ for p in plans} == {"create", "get", "exec_", "shell_run",
                                                            "node_loads"}
    for plan in plans:
        path = plan.route.path_format.replace("{sb_id}", "sb-x").replace("{sh_id}", "sh-y")
        scope = {"type": "http", "method": next(iter(plan.route.methods)), "path": path,
                 "root_path": "", "headers": []}
        picked = None
        for route in app.router.routes:  # FastAPI's order: the first full match wins
            match, child = route.matches(scope)
            if match.name == "FULL":
                picked = route
                if (inner := getattr(route, "_match", None)) is not None:
                    picked = inner(scope)[2]
                break
        assert picked is plan.route, path
    await node.close()


def test_a_route_with_a_query_parameter_cannot_be_hot():
    router = APIRouter()

    @router.get("/x/{a}")
    @hot
    async def x(request: Request, a: str, q: int = 0):
        return None

    with pytest.raises(TypeError, match="query"):
        _Plan.of(router.routes[0])



DEEP = b'{"a":' + b"[" * 5000 + b"]" * 5000 + b"}"


@pytest.mark.parametrize("node_api", [False, True], ids=["gateway", "node api"])
async def test_json_nested_past_the_stack_is_a_400_on_every_route(tmp_path, node_api):
    """json.loads raises RecursionError, not ValueError, for such a body: the lane must
    hand it on, and the router's bare "error parsing the body" must say why."""
    node = await open_simulated_node(tmp_path / "n")
    app = create_app(LocalCluster(node), TOKEN, node_api=node_api)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://t",
            headers={"authorization": f"Bearer {TOKEN}"}) as c:
        sb = (await c.post("/v1/sandboxes", json=SPEC)).json()["id"]
        for path in ("/v1/sandboxes", f"/v1/sandboxes/{sb}/exec", "/v1/sandboxes/batch"):
            r = await c.post(path, content=DEEP, headers={"content-type": "application/json"})
            assert r.status_code == 400, (path, r.text)
            assert r.json()["error"]["code"] == "invalid_argument"
            assert "nested too deeply" in r.json()["error"]["message"]
            assert "x-request-id" in r.headers
        for sb_id in list(node.records):
            await node.stop(sb_id)


async def test_a_long_id_is_quoted_shortened_in_errors(pair):
    """A 5000-character id (of no node, or of this node but no sandbox) is not echoed
    whole, whichever layer refuses it."""
    (fast, sb), _ = pair
    for bad in ("sb-" + "x" * 5000, sb + "x" * 5000):
        for method, path in (("GET", "/v1/sandboxes/{}"), ("GET", "/v1/sandboxes/{}/nope"),
                             ("DELETE", "/v1/sandboxes/{}"),
                             ("GET", "/v1/sandboxes/{}/processes/7")):
            r = await fast.request(method, path.format(bad))
            assert r.status_code == 404, r.text[:200]
            assert len(r.json()["error"]["message"]) < 400, (path, r.text[:200])
