"""The sync face offers exactly the async methods, with the async signatures mapped to
blocking types (``AsyncSandbox`` -> ``Sandbox``, ``AsyncIterator`` -> ``Iterator``), and
the shipped stub ``sync.pyi`` says so to static tools (E2B's test_parity, Modal's stubs)."""

import inspect
import re

import dsec
from dsec.sdk import AsyncClient, AsyncFiles, AsyncSandbox, AsyncShell, Client
from dsec.sdk.jobs import AsyncJobs
from dsec.sdk.process import AsyncProcess
from dsec.sdk.projects import AsyncProjects
from dsec.sdk.pty import AsyncPty
from dsec.sdk.sandbox import AsyncInput
from dsec.sdk.stubs import STUB_PATH, render
from dsec.sdk.sync import (_WRAPPERS, Files, Input, Jobs, Process, Projects, Pty, Sandbox,
                           Shell)

PAIRS = [(AsyncClient, Client), (AsyncSandbox, Sandbox), (AsyncShell, Shell),
         (AsyncFiles, Files), (AsyncInput, Input), (AsyncJobs, Jobs),
         (AsyncProcess, Process), (AsyncPty, Pty), (AsyncProjects, Projects)]


def public_methods(cls):
    return {n for n, f in vars(cls).items() if not n.startswith("_") and callable(f)}


def test_same_method_names():
    for a, s in PAIRS:
        names = {n for n in public_methods(a)}
        assert names <= set(dir(s)), (s, names - set(dir(s)))


def test_every_wrapped_class_is_compared():
    assert set(_WRAPPERS) == {a for a, _ in PAIRS}


def _mapped(annotation):
    """The mapping, written out again here so a bug in the SDK's own is caught."""
    if not isinstance(annotation, str):
        return annotation
    annotation = annotation.replace("AsyncIterator[", "Iterator[")
    return re.sub(r"\bAsync(\w+)", r"\1", annotation)


def test_mapped_signatures():
    for a, s in PAIRS:
        for name in public_methods(a):
            async_sig = inspect.signature(getattr(a, name))
            sync_sig = inspect.signature(getattr(s, name))
            assert list(async_sig.parameters) == list(sync_sig.parameters), name
            for pa, ps in zip(async_sig.parameters.values(), sync_sig.parameters.values()):
                assert (pa.kind, pa.default) == (ps.kind, ps.default), (name, pa.name)
                assert _mapped(pa.annotation) == ps.annotation, (name, pa.name)
            assert _mapped(async_sig.return_annotation) == sync_sig.return_annotation, name


def test_blocking_faces_return_blocking_types():
    ret = {(s.__name__, n): inspect.signature(getattr(s, n)).return_annotation
           for a, s in PAIRS for n in public_methods(a)}
    assert ret[("Client", "create")] == "Sandbox"
    assert ret[("Client", "create_many")] == "list[Sandbox]"
    assert ret[("Client", "get")] == "Sandbox"
    assert ret[("Sandbox", "shell")] == "Shell"
    assert ret[("Sandbox", "exec_stream")] == "Iterator[ExecEvent]"
    assert ret[("Jobs", "attach")] == "list[Sandbox]"
    assert ret[("Sandbox", "spawn")] == "Process"
    assert ret[("Sandbox", "process")] == "Process"
    assert ret[("Sandbox", "pty")] == "Pty"
    assert ret[("Process", "stream")] == "Iterator[ExecEvent]"
    assert ret[("Pty", "output")] == "Iterator[bytes]"
    assert not [k for k, v in ret.items() if "Async" in str(v)]


def test_shipped_stub_is_current():
    assert STUB_PATH.read_text() == render(), "stale: run python -m dsec.sdk.stubs"
    assert "Async" not in STUB_PATH.read_text()


def test_public_names():
    assert set(dsec.__all__) == {
        "AsyncClient", "Client", "AsyncSandbox", "Sandbox", "AsyncShell", "Shell",
        "AsyncProcess", "Process", "AsyncPty", "Pty", "ProcessInfo", "SandboxSpec", "SandboxInfo", "ExecResult", "ExecEvent", "FileInfo", "FnCallResult",
        "DSecError", "NotFound", "InvalidArgument", "Unauthorized", "Capacity",
        "SandboxTimeout", "SandboxStopped", "Unsupported", "Conflict", "TrajectoryDiverged",
        "Unavailable", "NodeLost", "RemoteError", "Internal", "Quota", "Forbidden",
        "QuotaExceeded"}
    for name in dsec.__all__:
        assert getattr(dsec, name) is not None


async def test_unreachable_server_is_a_clear_error():
    from tests.support.server import free_port
    async with dsec.AsyncClient(f"http://127.0.0.1:{free_port()}", "t") as c:
        try:
            await c.list()
        except dsec.Unavailable as exc:
            assert "is it running" in str(exc)
        else:
            raise AssertionError("expected Unavailable")


async def test_bad_arguments_raise_invalid_argument_before_any_request():
    async with dsec.AsyncClient("http://127.0.0.1:9", "t") as c:
        try:
            await c.create(memory_mb=4)
        except dsec.InvalidArgument as exc:
            assert "memory_mb must be between 16 and 65536; got 4" in str(exc)
        else:
            raise AssertionError("expected InvalidArgument")
