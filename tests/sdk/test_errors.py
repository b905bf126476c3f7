"""Only ``dsec.DSecError`` leaves the SDK, whatever the server (or no server) does.

Every public method of every SDK class is called, with arguments made from its parameter
names, against a closed port, against a server answering random bytes, and against one
answering well-formed HTTP with random statuses and bodies (hypothesis picks them). A new
SDK method is covered the day it is written; one whose parameters this table cannot fill
fails the test until it can. No dsec server is involved (a plain socket server in a thread).
"""

from __future__ import annotations

import asyncio
import inspect
import socket
import socketserver
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import dsec
from dsec.api.models import SandboxInfo, ShellInfo
from dsec.sdk import AsyncClient, AsyncFiles, AsyncSandbox, AsyncShell
from dsec.api.process import ProcessInfo
from dsec.sdk.jobs import AsyncJobs
from dsec.sdk.process import AsyncProcess
from dsec.sdk.pty import AsyncPty
from dsec.sdk.projects import AsyncProjects
from dsec.sdk.sandbox import AsyncInput
from tests.support.server import free_port

INFO = SandboxInfo(id="sb-0000-x", node="node-0000", backend="container", image="busybox",
                   state="running", cpu=1, memory_mb=64, disk_mb=64, created_at=0,
                   last_active_at=0)


def _samples(tmp: Path) -> dict[str, object]:
    local = tmp / "local.txt"
    local.write_bytes(b"hello")
    (tmp / "dir").mkdir(exist_ok=True)
    return {"cmd": "true", "path": "/tmp/a", "local": local, "data": b"x", "fn": "print(1)",
            "count": 2, "sandbox_id": "sb-0000-x", "job": "job-1", "tag": "t:1", "allow": {},
            "text": "a", "x": 1, "y": 1, "calls": ["print(1)"], "name": "busybox",
            "local_dir": tmp / "dir", "pid": 7, "timeout_s": 30.0, "rows": 24, "cols": 80,
            "signal": 9, "quota": dsec.Quota(sandboxes=1), "token": "tok-1",
            "project": "team/a"}


def _targets(client: AsyncClient):
    """(object, method name) for every public async method of every SDK class."""
    sb = AsyncSandbox(client, INFO)
    objects = [client, sb, sb.files, sb.input, client.jobs, client.projects,
               AsyncShell(client, ShellInfo(id="sh-1", sandbox_id=INFO.id)),
               AsyncProcess(client, INFO.id, ProcessInfo(pid=7, cmd="x", started_at=0,
                                                         running=True))]
    for obj in objects:
        for name, fn in vars(type(obj)).items():
            if obj is client and name == "close":
                continue  # the cleanup of the `async with`; a closed client is tested alone
            if not name.startswith("_") and (inspect.iscoroutinefunction(fn)
                                             or inspect.isasyncgenfunction(fn)):
                yield obj, name


def test_every_sdk_class_is_covered():
    classes = {AsyncClient, AsyncSandbox, AsyncShell, AsyncFiles, AsyncInput, AsyncJobs,
               AsyncProcess, AsyncPty, AsyncProjects}
    # every class the SDK's sync face wraps is one this test drives
    from dsec.sdk.sync import _WRAPPERS
    assert set(_WRAPPERS) <= classes, set(_WRAPPERS) - classes


async def _call(obj, name: str, samples: dict[str, object]):
    fn = getattr(obj, name)
    kwargs = {}
    for p in inspect.signature(fn).parameters.values():
        if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL,
                                                                   p.VAR_KEYWORD):
            assert p.name in samples, f"{type(obj).__name__}.{name}: no sample for {p.name!r}"
            kwargs[p.name] = samples[p.name]
    if inspect.isasyncgenfunction(getattr(type(obj), name)):
        async for _ in fn(**kwargs):
            pass
        return None
    return await fn(**kwargs)


async def _only_dsec_errors(url: str, tmp: Path) -> list[str]:
    """Call everything; return the calls that raised anything but DSecError."""
    escaped = []
    samples = _samples(tmp)
    async with AsyncClient(url, "t", timeout=5) as client:
        for obj, name in _targets(client):
            try:
                await asyncio.wait_for(_call(obj, name, samples), 30)
            except dsec.DSecError:
                pass
            except BaseException as exc:  # noqa: BLE001 - exactly what must not happen
                escaped.append(f"{type(obj).__name__}.{name}: {type(exc).__module__}."
                               f"{type(exc).__name__}: {exc}")
    return escaped


async def test_closed_port_raises_unavailable_everywhere(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    samples = _samples(tmp_path)
    async with AsyncClient(url, "t", timeout=5) as client:
        targets = list(_targets(client))
        assert len(targets) > 40
        for obj, name in targets:
            with pytest.raises(dsec.Unavailable, match="is it running"):
                await _call(obj, name, samples)


class _GarbageSocket:
    """A terminal connection whose server sends what no dsec server would."""

    def __init__(self, message) -> None:
        self.message = message

    async def recv(self):
        if isinstance(self.message, Exception):
            raise self.message
        return self.message

    async def send(self, message) -> None:
        from websockets.exceptions import ConnectionClosed
        raise ConnectionClosed(None, None)

    async def close(self) -> None:
        pass


@pytest.mark.parametrize("message", ["{", "[1]", '{"exit": "x"', '"text"', ValueError("x")])
async def test_pty_with_a_garbage_connection_raises_dsec_errors(message):
    pty = AsyncPty(_GarbageSocket(message), INFO.id)
    for call in (pty.read, pty.wait, lambda: pty.write("ls"), lambda: pty.resize(2, 2),
                 pty.kill):
        try:
            await asyncio.wait_for(call(), 10)
        except dsec.DSecError:
            pass


async def test_a_closed_client_says_so():
    client = AsyncClient(f"http://127.0.0.1:{free_port()}", "t")
    await client.close()
    with pytest.raises(dsec.InvalidArgument, match="closed"):
        await client.list()


def test_sync_face_raises_dsec_errors_for_streams_and_downloads(tmp_path):
    with dsec.Client(f"http://127.0.0.1:{free_port()}", "t") as c:
        sb = dsec.Sandbox._from_async(AsyncSandbox(c._async, INFO))
        with pytest.raises(dsec.Unavailable):
            list(sb.exec_stream("true"))
        with pytest.raises(dsec.Unavailable):
            sb.files.download("/etc/passwd", tmp_path / "x")
        with pytest.raises(dsec.InvalidArgument, match="lease_s"):
            c.jobs.heartbeat("j", lease_s=-1)
        with pytest.raises(dsec.InvalidArgument, match="timeout"):
            c.fncall("print(1)", timeout=-1)


class _Canned(socketserver.BaseRequestHandler):
    """Reads a request head, answers the canned bytes, closes."""

    answer = b""

    def handle(self) -> None:
        self.request.settimeout(5)
        try:
            got = b""
            while b"\r\n\r\n" not in got and len(got) < 1 << 16:
                chunk = self.request.recv(65536)
                if not chunk:
                    break
                got += chunk
            self.request.sendall(type(self).answer)
            self.request.shutdown(socket.SHUT_WR)
        except OSError:
            pass


@pytest.fixture(scope="module")
def canned():
    srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Canned)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _http(status: int, ctype: str, body: bytes) -> bytes:
    return (f"HTTP/1.1 {status} X\r\ncontent-type: {ctype}\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n").encode() + body


_json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                            lambda kids: st.lists(kids, max_size=3)
                            | st.dictionaries(st.sampled_from(
                                ["error", "code", "message", "id", "exit_code", "type",
                                 "sandboxes", "errors", "entries", "jobs"]), kids, max_size=4),
                            max_leaves=8)
_answers = st.one_of(
    st.binary(max_size=64),  # not HTTP at all
    st.builds(_http, st.sampled_from([200, 201, 204, 400, 401, 404, 409, 422, 429, 500, 502]),
              st.sampled_from(["application/json", "text/html", "application/x-ndjson"]),
              st.one_of(st.binary(max_size=64),
                        _json_values.map(lambda v: __import__("json").dumps(v).encode()))))


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(answer=_answers)
def test_garbage_answers_raise_only_dsec_errors(canned, tmp_path, answer):
    _Canned.answer = answer
    url = f"http://127.0.0.1:{canned.server_address[1]}"
    escaped = asyncio.run(_only_dsec_errors(url, tmp_path))
    assert not escaped, escaped


def _tar() -> bytes:
    import io
    import tarfile
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for i in range(10):
            info = tarfile.TarInfo(f"f{i}")
            tf.addfile(info, io.BytesIO(b""))
    return buf.getvalue()


@pytest.mark.parametrize("call", [
    lambda f: f.upload_tar("/tmp/up", _tar()),  # swapped: (data, path)
    lambda f: f.upload_tar(12, "/tmp/up"),
    lambda f: f.write(b"/tmp/a", b"x"),
    lambda f: f.write("/tmp/a", 12),
    lambda f: f.read(None),
    lambda f: f.upload(12, "/tmp/a"),
    lambda f: f.download("/tmp/a", 12),
    lambda f: f.upload_dir("/tmp", _tar()),
], ids=["upload_tar swapped", "upload_tar int", "write bytes path", "write int data",
        "read None", "upload int", "download int", "upload_dir bytes path"])
async def test_files_arguments_of_the_wrong_type_are_refused_before_sending(call):
    """A closed port: anything sent would raise Unavailable, not InvalidArgument."""
    async with AsyncClient(f"http://127.0.0.1:{free_port()}", "t", timeout=5) as client:
        with pytest.raises(dsec.InvalidArgument) as err:
            await call(AsyncSandbox(client, INFO).files)
        assert len(str(err.value)) < 300, str(err.value)


async def test_upload_tar_takes_a_file_object_too():
    import io
    async with AsyncClient(f"http://127.0.0.1:{free_port()}", "t", timeout=5) as client:
        with pytest.raises(dsec.Unavailable):
            await AsyncSandbox(client, INFO).files.upload_tar(io.BytesIO(_tar()), "/tmp/up")


def test_a_call_that_does_not_fit_the_signature_names_it(tmp_path):
    """The caller's mistake is InvalidArgument showing the signature, on both faces."""
    with dsec.Client(f"http://127.0.0.1:{free_port()}", "t") as c:
        sb = dsec.Sandbox._from_async(AsyncSandbox(c._async, INFO))
        with pytest.raises(dsec.InvalidArgument) as err:
            sb.files.download("/")
        assert str(err.value) == ("missing a required argument: 'local'; call it as "
                                  "Files.download(path, local)")
        with pytest.raises(dsec.InvalidArgument, match="unexpected keyword argument 'cwdir'; "
                                                       r"call it as Sandbox.exec_stream\(cmd, "):
            list(sb.exec_stream("true", cwdir="/"))  # an async generator method
        with pytest.raises(dsec.InvalidArgument, match="too many positional arguments"):
            sb.files.remove("/a", True, 3)


async def test_a_type_error_inside_the_sdk_stays_internal():
    from dsec.sdk.boundary import guarded

    @guarded
    class Probe:
        async def size(self, items):
            return len(items)  # a TypeError of the SDK's own making when items is an int

    with pytest.raises(dsec.Internal, match="TypeError"):
        await Probe().size(3)
    with pytest.raises(dsec.InvalidArgument, match=r"call it as Probe.size\(items\)"):
        await Probe().size()
