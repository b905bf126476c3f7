"""The E2B API's pure parts, checked against the e2b SDK's own client code (no server):
its request messages parse here, what is sent back parses there, and its URL signatures
verify."""

from __future__ import annotations

import json
import struct
import time

import pytest
from e2b.envd.filesystem import filesystem_pb
from e2b.envd.process import process_pb
from e2b.sandbox.signature import get_signature
from protobuf import Oneof

from dsec.api.models import ExecEvent, ExecResult, FileInfo
from dsec.integrations.e2b.auth import Keys
from dsec.integrations.e2b.connect import RpcError, end_stream, envelope
from dsec.integrations.e2b.filesystem import entry, resolve
from dsec.integrations.e2b.messages import (SendInputRequest, SendSignalRequest, StartRequest,
                                            StreamInputRequest, UpdateRequest, WatchRequest)
from dsec.integrations.e2b.process import _bytes_b64, _Relay
from dsec.integrations.e2b.watch import diff


def test_the_sdks_start_request_parses():
    sent = process_pb.StartRequest(process=process_pb.ProcessConfig(
        cmd="/bin/bash", args=["-l", "-c", "ls"], envs={"A": "1"}, cwd="/tmp"), stdin=False)
    got = StartRequest.model_validate_json(sent.to_json())
    assert (got.process.cmd, got.process.args, got.process.envs, got.process.cwd,
            got.stdin) == ("/bin/bash", ["-l", "-c", "ls"], {"A": "1"}, "/tmp", False)


def test_the_sdks_kill_request_parses():
    sent = process_pb.SendSignalRequest(
        process=process_pb.ProcessSelector(selector=Oneof("pid", 42)),
        signal=process_pb.Signal.SIGKILL)
    got = SendSignalRequest.model_validate_json(sent.to_json())
    assert (got.process.pid, got.signal) == (42, "SIGNAL_SIGKILL")


def test_an_entry_parses_in_the_sdk():
    info = FileInfo(path="/w/a.txt", name="a.txt", type="file", size=1 << 40, mode=0o100644,
                    mtime=1700000000.5)
    wire = entry(info).model_dump_json(by_alias=True, exclude_none=True)
    back = filesystem_pb.EntryInfo.from_json(wire)
    assert (back.name, back.type, back.size, back.mode, back.permissions) == \
        ("a.txt", filesystem_pb.FileType.FILE, 1 << 40, 0o644, "-rw-r--r--")
    assert back.modified_time.to_datetime().timestamp() == pytest.approx(1700000000.5)


def _frames(data: bytes) -> list[tuple[int, dict]]:
    out = []
    while data:
        flags, size = struct.unpack(">BI", data[:5])
        out.append((flags, json.loads(data[5:5 + size])))
        data = data[5 + size:]
    return out


def _events(relay: _Relay, evs: list[ExecEvent]) -> list[dict]:
    return [msg for ev in evs for _, msg in _frames(relay.feed(ev))]


def test_relay_sends_output_then_the_end():
    relay = _Relay(max_output=1 << 20, timeout=None)
    got = _events(relay, [ExecEvent(type="stderr", data="early"),
                          ExecEvent(type="stdout", data="hello"),
                          ExecEvent(type="exit", result=ExecResult(exit_code=2))])
    parsed = [process_pb.StartResponse.from_json(json.dumps(m)).event.event for m in got]
    assert [o.field for o in parsed] == ["data", "data", "end"]
    assert parsed[0].value.output == Oneof("stderr", b"early")
    assert parsed[1].value.output == Oneof("stdout", b"hello")
    assert parsed[2].value.exit_code == 2


def test_a_terminals_output_is_pty_data():
    relay = _Relay(max_output=1 << 20, timeout=None)
    relay.pty = True
    (msg,) = _events(relay, [ExecEvent(type="stdout", data="$ ")])
    parsed = process_pb.StartResponse.from_json(json.dumps(msg)).event.event
    assert parsed.value.output == Oneof("pty", b"$ ")


@pytest.mark.parametrize("result, code", [
    (ExecResult(exit_code=0, stdout_truncated=True), "out_of_range"),
    (ExecResult(exit_code=-9, timed_out=True), "deadline_exceeded")])
def test_relay_ends_a_cut_or_late_command_with_an_error(result, code):
    relay = _Relay(max_output=10, timeout=1.0)
    with pytest.raises(RpcError) as exc:
        relay.feed(ExecEvent(type="exit", result=result))
    assert exc.value.code == code


def test_the_sdks_input_requests_parse():
    sel = process_pb.ProcessSelector(selector=Oneof("pid", 7))
    sent = process_pb.SendInputRequest(process=sel, input=process_pb.ProcessInput(
        input=Oneof("pty", b"\x00\xffls\n")))
    got = SendInputRequest.model_validate_json(sent.to_json())
    assert got.process.pid == 7 and got.input.stdin is None
    assert _bytes_b64(got.input.pty) == "AP9scwo="
    resize = process_pb.UpdateRequest(process=sel, pty=process_pb.PTY(
        size=process_pb.PTY.Size(rows=30, cols=100)))
    size = UpdateRequest.model_validate_json(resize.to_json()).pty.size
    assert (size.rows, size.cols) == (30, 100)


def test_the_sdks_input_stream_messages_parse():
    from e2b.sandbox.commands.stream_input import stream_input_data, stream_input_start
    start = StreamInputRequest.model_validate_json(stream_input_start(9).to_json())
    data = StreamInputRequest.model_validate_json(stream_input_data("stdin", "hi").to_json())
    assert start.start.process.pid == 9 and start.data is None
    assert _bytes_b64(data.data.input.stdin) == "aGk="


def test_the_sdks_watch_request_parses():
    sent = filesystem_pb.CreateWatcherRequest(path="/w", recursive=True)
    got = WatchRequest.model_validate_json(sent.to_json())
    assert (got.path, got.recursive) == ("/w", True)


def test_diff_names_each_change_once():
    old = {"a": ("file", 1, 0o644, 1.0), "b": ("file", 1, 0o644, 1.0),
           "c": ("file", 1, 0o644, 1.0), "d": ("dir", 0, 0o755, 1.0)}
    new = {"a": ("file", 2, 0o644, 2.0), "c": ("file", 1, 0o600, 1.0),
           "d": ("dir", 0, 0o755, 5.0), "d/e": ("file", 0, 0o644, 5.0)}
    assert [(e["name"], e["type"]) for e in diff(old, new)] == [
        ("b", "EVENT_TYPE_REMOVE"), ("a", "EVENT_TYPE_WRITE"), ("c", "EVENT_TYPE_CHMOD"),
        ("d/e", "EVENT_TYPE_CREATE")]
    parsed = [filesystem_pb.FilesystemEvent.from_json(json.dumps(e)) for e in diff(old, new)]
    assert [p.name for p in parsed] == ["b", "a", "c", "d/e"]


def test_diff_of_the_same_listing_is_empty():
    same = {"a": ("file", 1, 0o644, 1.0)}
    assert diff(same, dict(same)) == []


def test_envelopes_frame_messages_and_the_end():
    frames = _frames(envelope({"a": 1}) + end_stream(RpcError("not_found", "gone")))
    assert frames == [(0, {"a": 1}), (2, {"error": {"code": "not_found", "message": "gone"}})]


@pytest.mark.parametrize("expires", [None, 3600])
def test_the_sdks_url_signature_verifies(expires):
    keys = Keys("dsec_token")
    sig = get_signature("/tmp/a", "read", None, keys.access_token("sb-1-2"), expires)
    assert keys.signature_ok("sb-1-2", "/tmp/a", "read", "", sig["signature"],
                             sig["expiration"])
    assert not keys.signature_ok("sb-1-3", "/tmp/a", "read", "", sig["signature"],
                                 sig["expiration"])
    assert not keys.signature_ok("sb-1-2", "/tmp/a", "write", "", sig["signature"],
                                 sig["expiration"])


def test_an_expired_signature_is_refused():
    keys = Keys("dsec_token")
    sig = get_signature("/a", "read", None, keys.access_token("sb-1-2"), -20)
    assert sig["expiration"] < time.time()
    assert not keys.signature_ok("sb-1-2", "/a", "read", "", sig["signature"],
                                 sig["expiration"])


def test_access_tokens_differ_per_sandbox_and_server():
    assert Keys("a").access_token("sb-1") != Keys("a").access_token("sb-2")
    assert Keys("a").access_token("sb-1") != Keys("b").access_token("sb-1")


@pytest.mark.parametrize("path, user, want", [
    ("a.txt", None, "/root/a.txt"), ("x/../b", "user", "/home/user/b"),
    ("/tmp//c/", None, "/tmp/c")])
def test_relative_paths_start_at_home(path, user, want):
    assert resolve(path, user) == want
