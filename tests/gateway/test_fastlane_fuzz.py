"""Schemathesis over the routes the fast lane serves, and then over the whole OpenAPI
document: for every generated request, valid or not, the gateway with its lane answers
exactly as the same gateway without it (status, content type, location and body, with
ids, secrets and times masked), and neither answers a 5xx.

Two gateway apps, each over its own simulated node (a real NodeService with its SQLite
store and trajectory log; the simulated backend runs no process, so no root resources),
served in process on one event loop in a thread of this test; hypothesis drives them from
the test's own thread. The schema is the app's own OpenAPI document. Bounded in time:
``FASTLANE_FUZZ_EXAMPLES`` examples (default 60) per hot operation and generation mode,
``FASTLANE_FUZZ_ALL_EXAMPLES`` (default 5) per other operation.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from dsec.cluster.local import LocalCluster
from dsec.gateway.app import create_app
from dsec.gateway.fastlane import FastLane
from dsec.node.backends.simulated import open_simulated_node
from tests.support import fuzz  # noqa: F401  (its serializer for tar bodies)

pytestmark = pytest.mark.timeout(600)
EXAMPLES = int(os.environ.get("FASTLANE_FUZZ_EXAMPLES", "60"))
ALL_EXAMPLES = int(os.environ.get("FASTLANE_FUZZ_ALL_EXAMPLES", "5"))
TOKEN = "dsec_fastlane-fuzz-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}  # as spelled in the cases: it replaces theirs
# what legitimately differs between two gateways fed the same request: their nodes' ids
# (in every sandbox id too), the random ids and secrets they made, and times
VOLATILE = {"duration_ms", "token", "at"}
# answers that read the machine now (CPU used, memory available, pressure): shapes only
READINGS = {"/v1/nodes", "/v1/nodes/load", "/metrics"}
IDS = re.compile(r"\b(sb|sh|proc|prj|tok|req|res|img|lyr)-[0-9a-f]+(-[0-9a-f]+)*")


class _Side:
    """One gateway app (lane in or out) with a sandbox of its own, driven in process."""

    def __init__(self, app, node, sb_id: str, client: httpx.AsyncClient) -> None:
        self.app, self.node, self.sb_id, self.client = app, node, sb_id, client
        self.short = node.node_id.removeprefix("node-")


class _Pair:
    """Both sides on one event loop running in a thread of its own."""

    def __init__(self, tmp) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.sides = [self.run(self._side(tmp, "fast", True)),
                      self.run(self._side(tmp, "slow", False))]

    def run(self, coro, timeout: float = 60):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _side(self, tmp, name: str, lane: bool) -> _Side:
        node = await open_simulated_node(tmp / name)
        app = create_app(LocalCluster(node), TOKEN)
        if lane:
            assert isinstance(app.router.middleware_stack, FastLane)
        else:  # the router the lane stands in front of
            app.router.middleware_stack = app.router.middleware_stack.app
        ctx = app.router.lifespan_context(app)
        await ctx.__aenter__()
        app.state.test_ctx = ctx
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                   base_url="http://t", headers=AUTH)
        r = await client.post("/v1/sandboxes", json={"memory_mb": 64, "cpu": 0.05})
        assert r.status_code == 201, r.text
        return _Side(app, node, r.json()["id"], client)

    async def _close(self) -> list[str]:
        left = []
        for s in self.sides:
            for sb in list(s.node.records):
                await s.node.stop(sb)
            await s.client.aclose()
            await s.app.state.test_ctx.__aexit__(None, None, None)
            left += [f"{s.node.node_id}: {sb}" for sb in s.node.records]
        return left

    def close(self) -> list[str]:
        try:
            return self.run(self._close())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    p = _Pair(tmp_path_factory.mktemp("fastlane-fuzz"))
    yield p
    assert not p.close(), "sandboxes left behind"


@pytest.fixture(scope="module")
def operations(pair):
    """``(hot, others)``: the schema's operations the lane serves, and the rest."""
    app = pair.sides[0].app
    schema = schemathesis.openapi.from_dict(app.openapi())
    lane = app.router.middleware_stack
    hot = {(m, p.route.path) for m, plans in lane.by_method.items() for p in plans}
    ops = [r.ok() for r in schema.get_all_operations()]
    served = [op for op in ops if (op.method.upper(), op.path) in hot]
    hidden = {(m, p.route.path) for m, plans in lane.by_method.items() for p in plans
              if not p.route.include_in_schema}  # the watcher's load probe, tested below
    assert {(op.method.upper(), op.path) for op in served} == hot - hidden  # each one fuzzed
    return served, [op for op in ops if (op.method.upper(), op.path) not in hot]


def _normal(resp: httpx.Response, side: _Side, shape_only: bool = False):
    """The answer with what differs between the two gateways masked."""
    text = IDS.sub(r"\1-ID", resp.content.decode("utf-8", "replace"))
    text = text.replace(side.short, "NODE")
    try:
        body = json.loads(text)
    except ValueError:
        return text

    def mask(x):
        if isinstance(x, dict):
            return {k: ("VOLATILE" if k in VOLATILE or k.endswith("_at") else mask(v))
                    for k, v in x.items()}
        if isinstance(x, list):
            return [mask(v) for v in x]
        return type(x).__name__ if shape_only else x
    return mask(body)


def _made(resp: httpx.Response) -> list[str]:
    if resp.status_code != 201:
        return []
    body = resp.json()
    if isinstance(body, dict) and isinstance(body.get("id"), str):
        return [body["id"]]
    return [s["id"] for s in body.get("sandboxes", [])]


async def _send(side: _Side, kw: dict) -> httpx.Response:
    url = kw["url"].replace("SANDBOX", side.sb_id)
    body = {}
    if "json" in kw:
        body["json"] = kw["json"]
    elif kw.get("data") is not None:
        body["content"] = kw["data"]
    resp = await side.client.request(kw["method"], url, headers=kw.get("headers"),
                                     params=kw.get("params"), **body)
    for sb in _made(resp):  # the fuzz's sandboxes go at once: both nodes stay alike
        if sb.startswith("sb-") and sb in side.node.records:
            await side.node.stop(sb)
    return resp


async def _both(pair: _Pair, kw: dict) -> list[httpx.Response]:
    out = []
    for s in pair.sides:
        out.append(await _send(s, kw))
        # the placements this request made are forgotten now on both sides, not at each
        # watcher's own next tick (which would let one side refuse what the other takes)
        await s.app.state.gateway.watcher.refresh()
    return out


def _compare(case, kw: dict, fast: httpx.Response, slow: httpx.Response, pair) -> str | None:
    ctype = next((v for k, v in kw["headers"].items() if k.lower() == "content-type"), None)
    where = (f"{case.method} {case.formatted_path} ({ctype}) "
             f"{str(kw.get('json', kw.get('data')))[:300]}"
             f"\n  lane: {fast.status_code} {fast.content[:300]!r}"
             f"\n  router: {slow.status_code} {slow.content[:300]!r}")
    if fast.status_code >= 500 or slow.status_code >= 500:
        return f"a server error: {where}"
    if fast.status_code != slow.status_code:
        return f"status differs: {where}"
    for h in ("content-type", "location"):
        if fast.headers.get(h) != slow.headers.get(h):
            return f"{h} differs ({fast.headers.get(h)} / {slow.headers.get(h)}): {where}"
    shape = case.path in READINGS
    if _normal(fast, pair.sides[0], shape) != _normal(slow, pair.sides[1], shape):
        return f"body differs: {where}"
    return None


def _variants(kw: dict) -> list[dict]:
    """The request as generated, and with a body: the same bytes labelled as text, and
    with no content type at all (the lane must hand both to the router)."""
    if "json" not in kw:
        return [kw]
    raw = json.dumps(kw["json"]).encode()
    bare = {k: v for k, v in kw["headers"].items() if k.lower() != "content-type"}
    rest = {k: v for k, v in kw.items() if k not in ("json", "headers")}
    return [kw, {**rest, "data": raw, "headers": {**bare, "Content-Type": "text/plain"}},
            {**rest, "data": raw, "headers": bare}]


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _timeless(body, path: str) -> None:
    """Take wall-clock time out of what the two sides decide: the two get each request
    a moment apart, so a rate quota's bucket, a short job lease or a sandbox's short
    timeout could run out on one side only."""
    if isinstance(body, list):
        for x in body:
            _timeless(x, path)
    if not isinstance(body, dict):
        return
    for k, v in list(body.items()):
        if k == "creations_per_s":
            body[k] = None
        elif k in ("lease_s", "stop_after_s") and _num(v):
            body[k] = max(v, 600)
        elif k == "timeout_s" and path.endswith("/timeout") and _num(v):
            body[k] = max(v, 600)
        else:
            _timeless(v, path)


def _fuzz(pair, operations, modes, examples: int, variants: bool = False) -> list[str]:
    failures: list[str] = []
    for op in operations:
        for mode in modes:
            @settings(max_examples=examples, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck), phases=[Phase.generate])
            @given(op.as_strategy(generation_mode=mode))
            def run(case):
                params = case.path_parameters or {}
                if isinstance(params.get("sb_id"), str):  # aim at a live sandbox each side
                    params["sb_id"] = "SANDBOX"
                body = case.body  # a create that waits for room waits wait_s: not here
                _timeless(body, case.path)
                if case.path == "/v1/sandboxes/batch" and isinstance(body, dict) \
                        and isinstance(body.get("count"), (int, float)) \
                        and not isinstance(body["count"], bool):  # 889.0 is a count too
                    body["count"] = min(body["count"], 2)  # room is not the question here
                for spec in (body, body.get("spec")) if isinstance(body, dict) else ():
                    if isinstance(spec, dict) and isinstance(spec.get("wait_s"), (int, float)) \
                            and not isinstance(spec["wait_s"], bool):
                        spec["wait_s"] = min(spec["wait_s"], 0.1)
                kw = case.as_transport_kwargs(base_url="http://t", headers=AUTH)
                for one in _variants(kw) if variants else [kw]:
                    fast, slow = pair.run(_both(pair, one))
                    if why := _compare(case, one, fast, slow, pair):
                        failures.append(why)
                        raise AssertionError(why)  # this operation's first failure is enough

            try:
                run()
            except AssertionError:
                pass
            except Unsatisfiable:  # nothing in this operation can be made invalid
                pass
    return failures


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
                         ids=["valid", "invalid"])
def test_the_lane_answers_fuzzed_requests_exactly_as_the_router(pair, operations, mode):
    failures = _fuzz(pair, operations[0], [mode], EXAMPLES, variants=True)
    assert not failures, "\n\n".join(failures)


def test_every_other_route_answers_alike_with_the_lane_and_without(pair, operations):
    """The lane hands these to the router untouched; a lane that caught one of them (or
    lost its body) would show here."""
    assert len(operations[1]) > 20
    failures = _fuzz(pair, operations[1], [GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
                     ALL_EXAMPLES)
    assert not failures, "\n\n".join(failures)


def test_the_load_probe_answers_alike_with_the_lane_and_without(pair):
    """The one hot route hidden from the schema (what a gateway's watcher asks a node)."""
    got = []
    for side in pair.sides:
        resp = pair.run(side.client.get("/v1/nodes/load"))
        assert resp.status_code == 200 and resp.headers["content-type"] == "application/json"
        body = resp.json()
        assert [d["node_id"] for d in body] == [side.node.node_id]
        assert body[0]["sandboxes"] == len(side.node.records)
        got.append({k: type(v).__name__ for k, v in body[0].items()})
    assert got[0] == got[1]
