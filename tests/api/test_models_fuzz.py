"""Property tests of the wire models: whatever JSON-ish input a caller sends, a request model
either validates or fails as InvalidArgument; what validates round-trips through JSON and
can be stored (encodes as UTF-8) and sent to the agent."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsec.api.errors import InvalidArgument
from dsec.api.fncall import FnCallBatch, FnCallRequest
from dsec.api.limits import DEFAULT_LIMITS, string_problem
from dsec.api.models import (CreateManyRequest, ExecRequest, InputRequest, NetworkPolicy,
                             PackDiffRequest, SandboxSpec, ShellRunRequest, validated,
                             validated_json)
from dsec.api.rl import HeartbeatRequest, NetworkRequest
from dsec.node.agent.client import SpawnRequest
from dsec.node.execution import check_spawn

MODELS = [SandboxSpec, CreateManyRequest, ExecRequest, ShellRunRequest, PackDiffRequest,
          InputRequest, NetworkPolicy, FnCallRequest, FnCallBatch, HeartbeatRequest,
          NetworkRequest]

# every code point: lone surrogates (category Cs, which characters() leaves out unless
# asked) and NUL included, and often
ANY_CHAR = st.characters() | st.characters(categories=["Cs"]) | st.sampled_from("\0=:/")
BAD = st.sampled_from(["\0", "\ud800", "\udc80", "\udfff"])
any_text = st.text(ANY_CHAR, max_size=12)
bad_text = st.builds(lambda a, b, c: a + b + c, any_text, BAD, any_text)
text = any_text | bad_text | st.sampled_from(
    ["", "\0", "\ud800", "a=b", "busybox", "python", "sh", "echo hi", "/tmp", "aGk=", "**",
     "root", "65534:4294967296", "4294967296", "²", "none", "left", "x" * 5000])
ints = st.integers() | st.sampled_from([0, 1, -1, 16, 512, 1 << 31, 1 << 63, 1 << 64, 10 ** 30])
floats = st.floats(allow_nan=True, allow_infinity=True)
scalars = st.none() | st.booleans() | ints | floats | text
json_ish = st.recursive(scalars, lambda kids: st.lists(kids, max_size=4)
                        | st.dictionaries(text, kids, max_size=4), max_leaves=12)


def fields_of(cls) -> st.SearchStrategy[dict]:
    """Bodies whose keys are mostly the model's own fields (so validation gets past the
    unknown-field check), with any values; nested models get their own bodies."""
    names = sorted(cls.model_fields)
    value = json_ish
    if cls is CreateManyRequest:
        value = json_ish | fields_of(SandboxSpec)
    if cls is FnCallBatch:
        value = json_ish | st.lists(fields_of(FnCallRequest), min_size=1, max_size=2)
    known = st.dictionaries(st.sampled_from(names), value, max_size=len(names))
    return known | st.dictionaries(text, json_ish, max_size=3)


def strings(v):
    if isinstance(v, str):
        yield v
    elif isinstance(v, dict):
        for k, x in v.items():
            yield from strings(k)
            yield from strings(x)
    elif isinstance(v, (list, tuple)):
        for x in v:
            yield from strings(x)


def check_valid(m) -> None:
    for s in strings(m.model_dump()):  # nothing a C string or UTF-8 cannot carry
        assert string_problem(s) is None, s
    wire = m.model_dump_json()
    wire.encode("utf-8")  # storable: SQLite and HTTP bodies are UTF-8
    json.dumps(m.model_dump(mode="json"), ensure_ascii=False).encode("utf-8")
    assert type(m).model_validate_json(wire) == m
    if isinstance(m, ExecRequest):
        argv = ["/bin/sh", "-c", m.cmd] if isinstance(m.cmd, str) else m.cmd
        spawn = SpawnRequest(argv=argv, env=m.env, cwd=m.cwd or "/")
        try:
            check_spawn(spawn)
        except InvalidArgument:
            pass


@pytest.mark.parametrize("cls", MODELS, ids=lambda c: c.__name__)
def test_any_body_validates_or_is_invalid_argument(cls):
    @settings(max_examples=300, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(fields_of(cls))
    def run(body):
        try:
            m = validated(cls, **body) if all(isinstance(k, str) for k in body) else None
        except InvalidArgument as exc:
            json.dumps(exc.to_wire(), ensure_ascii=False).encode("utf-8")
            return
        if m is not None:
            check_valid(m)

    run()


@pytest.mark.parametrize("cls", MODELS, ids=lambda c: c.__name__)
def test_any_json_text_validates_or_is_invalid_argument(cls):
    @settings(max_examples=200, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(fields_of(cls) | json_ish)
    def run(body):
        raw = json.dumps(body).encode()  # \ud800 escapes: what a hostile client sends
        try:
            m = validated_json(cls, raw)
        except InvalidArgument as exc:
            json.dumps(exc.to_wire(), ensure_ascii=False).encode("utf-8")
            return
        check_valid(m)

    run()


@settings(max_examples=300, deadline=None)  # a loaded CI machine must not fail it
@given(any_text.filter(bool) | bad_text)
def test_a_string_with_nul_or_a_lone_surrogate_is_never_accepted(s):
    bad = "\0" in s or any(0xD800 <= ord(c) <= 0xDFFF for c in s)
    for body in ({"labels": {"k": s}}, {"env": {"K": s}}, {"job": s}, {"image": s}):
        try:
            validated(SandboxSpec, **body)
            assert not bad, body
        except InvalidArgument as exc:
            if bad:
                assert "NUL" in exc.message or "surrogate" in exc.message


def test_limits_are_named_in_the_refusal():
    lim = DEFAULT_LIMITS
    cases = [(SandboxSpec, {"labels": {str(i): "" for i in range(lim.labels + 1)}},
              "limits.labels"),
             (SandboxSpec, {"labels": {"k": "x" * (lim.label_value_bytes + 1)}},
              "limits.label_value_bytes"),
             (ExecRequest, {"cmd": ["a"] * (lim.argv + 1)}, "limits.argv"),
             (ExecRequest, {"cmd": "x" * (lim.cmd_bytes + 1)}, "limits.cmd_bytes"),
             (ExecRequest, {"cmd": "x", "env": {f"K{i}": "" for i in range(lim.env + 1)}},
              "limits.env"),
             (ExecRequest, {"cmd": "x", "env": {"K": "x" * lim.env_bytes}}, "limits.env_bytes"),
             (ExecRequest, {"cmd": "x", "cwd": "/" * (lim.path_bytes + 1)}, "limits.path_bytes"),
             (ShellRunRequest, {"cmd": "x" * (lim.cmd_bytes + 1)}, "limits.cmd_bytes"),
             (FnCallRequest, {"code": "1", "env": {f"K{i}": "" for i in range(lim.env + 1)}},
              "limits.env")]
    for cls, body, name in cases:
        with pytest.raises(InvalidArgument, match=name.replace(".", r"\.")):
            validated(cls, **body)


@pytest.mark.parametrize("user", ["4294967295", "4294967296", "0:4294967296", "a:b", "x y",
                                  "nobody:²", ":0"])
def test_users_out_of_range_are_refused(user):
    with pytest.raises(InvalidArgument, match="user"):
        validated(ExecRequest, cmd="id", user=user)


@pytest.mark.parametrize("user", ["root", "nobody", "65534", "65534:65534", "4294967294", "²"])
def test_users_in_range_pass(user):
    assert validated(ExecRequest, cmd="id", user=user).user == user
