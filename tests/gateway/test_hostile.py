"""Hostile requests (issue 13): each gets a 4xx naming what to change, never a 5xx, never a
route broken for later callers, never a sandbox created and not returned."""

from __future__ import annotations

import gzip
import io
import json
import os
import tarfile

import httpx
import pytest


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=120,
                      headers={"authorization": f"Bearer {server.token}"}) as c:
        yield c


@pytest.fixture
def sb_id(http):
    r = http.post("/v1/sandboxes", json={"memory_mb": 64})
    assert r.status_code == 201, r.text
    yield r.json()["id"]
    http.delete(f"/v1/sandboxes/{r.json()['id']}")


def ids(http) -> set[str]:
    r = http.get("/v1/sandboxes")
    assert r.status_code == 200, r.text
    return {s["id"] for s in r.json()["sandboxes"]}


def post_raw(http, path: str, body: str) -> httpx.Response:
    """``body`` is JSON text as sent: ``\\ud800`` escapes reach the server unpaired."""
    return http.post(path, content=body.encode(), headers={"content-type": "application/json"})


def invalid(r: httpx.Response, *words: str, status: int = 400) -> str:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] in ("invalid_argument", "too_large"), err
    for w in words:
        assert w in err["message"], err["message"]
    return err["message"]


# ---- strings: NUL bytes and lone surrogates ----

def test_lone_surrogate_label_is_refused_and_the_list_keeps_working(http):
    before = ids(http)
    invalid(post_raw(http, "/v1/sandboxes", '{"memory_mb": 64, "labels": {"k": "a\\ud800b"}}'),
            "labels", "surrogate")
    assert ids(http) == before


BAD_CREATES = {
    "env key NUL": '{"env": {"A\\u0000B": "1"}}',
    "env value NUL": '{"env": {"A": "x\\u0000y"}}',
    "env value surrogate": '{"env": {"A": "\\udc80"}}',
    "job NUL": '{"job": "j\\u0000"}',
    "image NUL": '{"image": "busybox\\u0000"}',
    "label key surrogate": '{"labels": {"\\ud83d": "v"}}',
    "layers NUL": '{"layers": ["a\\u0000"]}',
}


@pytest.mark.parametrize("body", BAD_CREATES.values(), ids=BAD_CREATES.keys())
def test_bad_strings_in_a_create_are_refused_and_nothing_is_left(http, body):
    before = ids(http)
    msg = invalid(post_raw(http, "/v1/sandboxes", body))
    assert "NUL" in msg or "surrogate" in msg
    assert ids(http) == before


BAD_EXECS = {
    "cmd NUL": ('{"cmd": "echo a\\u0000b"}', "cmd"),
    "argv NUL": ('{"cmd": ["echo", "a\\u0000"]}', "cmd"),
    "argv surrogate": ('{"cmd": ["echo", "\\ud800"]}', "cmd"),
    "cwd NUL": ('{"cmd": "true", "cwd": "/tmp\\u0000"}', "cwd"),
    "env NUL": ('{"cmd": "true", "env": {"X": "\\u0000"}}', "env"),
    "user NUL": ('{"cmd": "true", "user": "root\\u0000"}', "user"),
}


@pytest.mark.parametrize("body,field", BAD_EXECS.values(), ids=BAD_EXECS.keys())
def test_bad_strings_in_an_exec_are_refused(http, sb_id, body, field):
    invalid(post_raw(http, f"/v1/sandboxes/{sb_id}/exec", body), field)
    assert http.post(f"/v1/sandboxes/{sb_id}/exec", json={"cmd": "true"}).status_code == 200


def test_bad_strings_in_a_shell_run_are_refused(http, sb_id):
    sh = http.post(f"/v1/sandboxes/{sb_id}/shells").json()["id"]
    invalid(post_raw(http, f"/v1/sandboxes/{sb_id}/shells/{sh}/run", '{"cmd": "\\ud800"}'),
            "cmd", "surrogate")


@pytest.mark.parametrize("route", ["", "/stat", "/list", "/tar"])
def test_nul_in_a_file_path_is_refused(http, sb_id, route):
    invalid(http.get(f"/v1/sandboxes/{sb_id}/files{route}", params={"path": "/tmp/a\0b"}),
            "path", "NUL")


def test_nul_in_a_url_path_is_refused(http):
    invalid(http.get("/v1/jobs/a%00b"), "NUL")


# ---- malformed payloads ----

def _truncated_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        info = tarfile.TarInfo("a.txt")
        info.size = 10000
        tf.addfile(info, io.BytesIO(os.urandom(10000)))
    return buf.getvalue()[:3000]


TARS = {"random": os.urandom(5000), "empty": b"", "truncated": _truncated_tar(),
        "gzip of garbage": gzip.compress(os.urandom(5000)),
        "bad gzip": b"\x1f\x8b\x08\x00" + os.urandom(500)}


@pytest.mark.parametrize("body", TARS.values(), ids=TARS.keys())
def test_a_bad_tar_upload_is_invalid(http, sb_id, body):
    invalid(http.put(f"/v1/sandboxes/{sb_id}/files/tar", params={"path": "/tmp/up"},
                     content=body), "tar")
    assert http.get(f"/v1/sandboxes/{sb_id}/files/list", params={"path": "/"}).status_code == 200


def test_stdin_that_is_not_base64_is_invalid(http, sb_id):
    invalid(http.post(f"/v1/sandboxes/{sb_id}/exec", json={"cmd": "cat", "stdin": "**nope**"}),
            "stdin", "base64")


def test_trajectory_offset_beyond_64_bits_is_invalid(http, sb_id):
    invalid(http.get(f"/v1/sandboxes/{sb_id}/trajectory", params={"offset": 2 ** 64}), "offset")


# ---- sizes ----

def test_a_huge_json_body_is_413_naming_the_limit(http):
    before = ids(http)
    body = json.dumps({"labels": {"k": "x" * (50 << 20)}})
    invalid(post_raw(http, "/v1/sandboxes", body), "body", "limits.", status=413)
    assert ids(http) == before


def test_a_huge_chunked_json_body_is_413(http):
    def chunks():
        yield b'{"labels": {"k": "'
        for _ in range(50):
            yield b"x" * (1 << 20)
        yield b'"}}'
    r = http.post("/v1/sandboxes", content=chunks(), headers={"content-type": "application/json"})
    invalid(r, "body", status=413)


def test_label_sizes_are_limited(http):
    invalid(http.post("/v1/sandboxes", json={"labels": {"k": "x" * 100_000}}), "labels", "limits.")
    invalid(http.post("/v1/sandboxes", json={"labels": {str(i): "" for i in range(1000)}}),
            "labels", "limits.")


@pytest.mark.parametrize("req,word", [
    ({"cmd": ["true"] * 4097}, "cmd"),
    ({"cmd": "true", "env": {f"E{i}": "1" for i in range(5000)}}, "env"),
    ({"cmd": ["echo", "x" * (2 << 20)]}, "cmd"),
    ({"cmd": "echo " + "x" * (2 << 20)}, "cmd"),
], ids=["4097 argv", "5000 env", "2 MB argument", "2 MB command"])
def test_exec_limits_are_checked_before_the_agent(http, sb_id, req, word):
    invalid(http.post(f"/v1/sandboxes/{sb_id}/exec", json=req), word, "limits.")
    r = http.post(f"/v1/sandboxes/{sb_id}/exec", json={"cmd": "echo ok"})
    assert r.status_code == 200 and r.json()["stdout"] == "ok\n"


def test_a_50_mb_command_is_refused(http, sb_id):
    r = http.post(f"/v1/sandboxes/{sb_id}/exec", json={"cmd": "echo " + "x" * (50 << 20)})
    assert r.status_code in (400, 413), r.text
    assert http.get(f"/v1/sandboxes/{sb_id}").json()["state"] == "running"


def test_an_env_that_would_overflow_the_agent_frame_is_invalid(http, sb_id):
    # within every per-field limit, but escaped for the agent it passes 1 MiB
    env = {f"E{i}": "\x01" * 200 for i in range(1000)}
    invalid(http.post(f"/v1/sandboxes/{sb_id}/exec", json={"cmd": "true", "env": env}), "agent")


# ---- users ----

@pytest.mark.parametrize("user", ["4294967296", "65534:4294967296", "4294967295",
                                  "-1", "²", "nobody:²", "no-such-user"])
def test_out_of_range_or_unknown_users_are_invalid_never_root(http, sb_id, user):
    invalid(http.post(f"/v1/sandboxes/{sb_id}/exec", json={"cmd": "id", "user": user}), "user")


def test_a_numeric_user_runs_as_that_user(http, sb_id):
    r = http.post(f"/v1/sandboxes/{sb_id}/exec",
                  json={"cmd": "id -u; id -g", "user": "65534:65533"})
    assert r.json()["stdout"].split() == ["65534", "65533"]


# ---- shells ----

def test_a_shell_that_exited_answers_stopped_not_500(http, sb_id):
    sh = http.post(f"/v1/sandboxes/{sb_id}/shells").json()["id"]
    run = f"/v1/sandboxes/{sb_id}/shells/{sh}/run"
    first = http.post(run, json={"cmd": "& x", "timeout": 3})  # a syntax error ends plain sh
    assert first.status_code == 410, first.text
    again = http.post(run, json={"cmd": "echo hi", "timeout": 3})
    assert again.status_code == 410 and "open a new shell" in again.json()["error"]["message"]


# ---- terminal control frames ----

@pytest.mark.parametrize("text", ['{"resize":' + "[" * 5000 + "]" * 5000 + "}", "{", "[1]",
                                  '{"resize": [0, 80]}', '{"resize": [24]}', '"x"'],
                         ids=["nested", "not JSON", "not an object", "zero rows", "one number",
                              "a string"])
def test_a_bad_terminal_control_frame_is_invalid_naming_the_shape(text):
    from dsec.api.errors import InvalidArgument
    from dsec.gateway.routes.streams import _resize
    with pytest.raises(InvalidArgument, match="resize|rows"):
        _resize(text)


def test_a_terminal_resize_frame_gives_rows_and_cols():
    from dsec.gateway.routes.streams import _resize
    assert _resize('{"resize": [30, 100]}') == (30, 100)


@pytest.mark.parametrize("raw, why", [
    (b"POST /v1/jobs/j/pause HTTP/1.1\r\nHost: a\r\ntransfer-encoding: \r\n"
     b"content-length: 0\r\n\r\n", "Empty Transfer-Encoding"),
    (b"GET /healthz HTTP/1.1\r\nHost: a\r\nno colon here\r\n\r\n", "header"),
    (b"POST /v1/sandboxes HTTP/1.1\r\nHost: a\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
     "chunk size"),
])
def test_a_request_that_is_not_http_gets_the_error_body(server, http, raw, why):
    """The HTTP parser's refusals (before the app runs) answer in dsec's error shape and
    name what the parser refused; the server serves the next caller."""
    import socket
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(raw)
        got = b""
        while chunk := s.recv(65536):  # the server closes after its answer
            got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), got
    assert b"content-type: application/json" in head.lower(), head
    err = json.loads(body)["error"]
    assert err["code"] == "invalid_argument" and why in err["message"], err
    assert http.get("/healthz").status_code == 200
