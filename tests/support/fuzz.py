"""Schemathesis over a server's own /openapi.json: the checks and the driver that both the
embedded server's fuzz (tests/gateway/test_fuzz.py) and the cluster gateway's
(tests/cluster/test_fuzz_relay.py) run. No request it generates, valid or not, may get a
server error or an error without the structured body.

A few fields are clamped so the fuzz stays cheap, not so it stays polite: command timeouts,
batch counts, background commands, how long a create may wait for room. Every sandbox a
create returned is stopped at once.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import FlakyFailure, Unsatisfiable
from schemathesis import GenerationMode

__all__ = ["EXAMPLES", "schema", "http", "live", "fuzz_every_operation", "unreturned"]

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "30"))
# Refusals the error table answers with a 5xx on purpose: none. "No room now" is 429 and a
# verb this sandbox's backend lacks is 400; a 5xx from a healthy server is a bug.
REFUSALS_5XX: dict[int, set[str]] = {}
# A tar upload's body is bytes like any other (schemathesis knows no application/x-tar);
# registered for every schemathesis user that imports this module.
schemathesis.serializer.alias("application/x-tar", "application/octet-stream")


def schema(url: str, token: str):
    config = schemathesis.Config.from_dict({"generation": {"max-examples": EXAMPLES}})
    return schemathesis.openapi.from_url(f"{url}/openapi.json", config=config,
                                         headers={"authorization": f"Bearer {token}"})


# Fixtures of a fuzz module, which imports them and provides ``fuzzed``: the server under
# fuzz (its ``url`` and ``token``).
@pytest.fixture(scope="module")
def http(fuzzed):
    with httpx.Client(base_url=fuzzed.url, timeout=120,
                      headers={"authorization": f"Bearer {fuzzed.token}"}) as c:
        yield c


@pytest.fixture(scope="module")
def live(http) -> dict:
    """A running sandbox and shell the fuzz aims its per-sandbox routes at (random ids only
    404), and the set of every sandbox id a caller was given."""
    r = http.post("/v1/sandboxes", json={"memory_mb": 64})
    assert r.status_code == 201, r.text
    sb_id = r.json()["id"]
    sh = http.post(f"/v1/sandboxes/{sb_id}/shells")
    assert sh.status_code == 201, sh.text
    return {"id": sb_id, "shell": sh.json()["id"], "returned": {sb_id}}


def _aim(case, live: dict) -> None:
    """Point per-sandbox routes at the live sandbox and shell (except their stop and close)
    and clamp costs."""
    params = case.path_parameters or {}
    ends = case.method.upper() == "DELETE" and case.path in (
        "/v1/sandboxes/{sb_id}", "/v1/sandboxes/{sb_id}/shells/{sh_id}")
    if "sb_id" in params and not ends:
        params["sb_id"] = live["id"]
        if "sh_id" in params:
            params["sh_id"] = live["shell"]
    body = case.body
    if isinstance(body, dict):
        t = body.get("timeout")
        if isinstance(t, (int, float)) and not isinstance(t, bool):
            body["timeout"] = min(t, 3)
        elif case.path.endswith(("/exec", "/exec/stream", "/run", "/processes", "/wait")):
            body["timeout"] = 3  # absent (60 s) or None (none): a half-typed line waits
        if body.get("background") is True:
            body["background"] = False
        ttl = body.get("timeout_s")
        if case.path.endswith("/timeout") and isinstance(ttl, (int, float)):
            body["timeout_s"] = max(ttl, 600)  # the live sandbox must outlive the fuzz
        count = body.get("count")  # an integer-valued float (889.0) is a count too
        if case.path == "/v1/sandboxes/batch" and isinstance(count, (int, float)) \
                and not isinstance(count, bool):
            body["count"] = min(count, 2)
        for spec in (body, body.get("spec")):  # a create queued for room waits wait_s
            if isinstance(spec, dict) and isinstance(spec.get("wait_s"), (int, float)) \
                    and not isinstance(spec["wait_s"], bool):
                spec["wait_s"] = min(spec["wait_s"], 0.1)


def _returned(content: bytes) -> list[str]:
    try:
        body = json.loads(content)
    except ValueError:
        return []
    if isinstance(body, dict) and isinstance(body.get("id"), str):
        return [body["id"]]
    if isinstance(body, dict) and isinstance(body.get("sandboxes"), list):
        return [s["id"] for s in body["sandboxes"] if isinstance(s, dict) and "id" in s]
    return []


def problem(case, resp) -> str | None:
    """Why this answer is a failure, or None."""
    where = (f"{case.method} {case.formatted_path} -> {resp.status_code} "
             f"{resp.content[:300]!r}\n{case.as_curl_command()[:1500]}")
    if resp.status_code < 400 or (case.method.upper() == "HEAD" and resp.status_code < 500):
        return None  # a HEAD answer has no body to carry the error
    try:
        err = json.loads(resp.content).get("error")
    except (ValueError, AttributeError):
        err = None
    if not (isinstance(err, dict) and err.get("message")):
        return f"an error without the structured body: {where}"
    if resp.status_code >= 500 and err.get("code") not in REFUSALS_5XX.get(resp.status_code, ()):
        return f"a server error: {where}"
    return None


def _node_gone(resp) -> bool:
    """A gateway's answer that the node did not answer (NodeLost, or no node healthy)."""
    if resp.status_code != 503:
        return False
    try:
        return json.loads(resp.content)["error"]["code"] in ("node_lost", "unavailable")
    except (ValueError, KeyError, TypeError):
        return False


def fuzz_every_operation(api_schema, http: httpx.Client, live: dict, token: str,
                         recover: Callable[[], bool] | None = None) -> list[str]:
    """Every operation, positive and negative examples; the failures, at most one per
    operation and mode.

    With ``recover`` (a gateway's fuzz): an answer that the node did not answer is the
    watcher's verdict on a node that stalled, not a verdict on the request, so
    ``recover`` waits for the node to be healthy again and the request is sent once more;
    if it never comes back (``recover`` returns False), that is the failure."""
    auth = {"authorization": f"Bearer {token}"}
    failures: list[str] = []
    operations = [r.ok() for r in api_schema.get_all_operations()]
    assert len(operations) > 20
    for op in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            @settings(max_examples=EXAMPLES, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck), phases=[Phase.generate])
            @given(op.as_strategy(generation_mode=mode))
            def run(case):
                _aim(case, live)
                resp = case.call(headers=auth, timeout=60)
                if recover is not None and _node_gone(resp):
                    if not recover():
                        why = f"the node never came back after: {problem(case, resp)}"
                        failures.append(why)
                        raise AssertionError(why)
                    resp = case.call(headers=auth, timeout=60)
                if case.method.upper() == "POST" and resp.status_code == 201:
                    for sb_id in _returned(resp.content):  # the caller's now: stop it
                        if sb_id != live["id"]:
                            live["returned"].add(sb_id)
                            http.delete(f"/v1/sandboxes/{sb_id}")
                if why := problem(case, resp):
                    failures.append(why)
                    raise AssertionError(why)  # end this operation at its first failure

            try:
                run()
            except (AssertionError, FlakyFailure):  # noted in failures; on to the next
                pass
            except Unsatisfiable:  # nothing in this operation can be made invalid
                pass
    return failures


def unreturned(http: httpx.Client, live: dict) -> set[str]:
    """Sandboxes the list shows that no caller was given (after the fuzz)."""
    r = http.get("/v1/sandboxes")
    assert r.status_code == 200, r.text
    return {s["id"] for s in r.json()["sandboxes"]} - live["returned"]
