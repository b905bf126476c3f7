"""The sync face must offer exactly the async methods, with the same signatures."""

import inspect

import dsec
from dsec.sdk import AsyncClient, AsyncFiles, AsyncSandbox, AsyncShell, Client
from dsec.sdk.sandbox import AsyncInput
from dsec.sdk.sync import Files, Input, Sandbox, Shell

PAIRS = [(AsyncClient, Client), (AsyncSandbox, Sandbox), (AsyncShell, Shell),
         (AsyncFiles, Files), (AsyncInput, Input)]


def public_methods(cls):
    return {n for n, f in vars(cls).items() if not n.startswith("_") and callable(f)}


def test_same_method_names():
    for a, s in PAIRS:
        names = {n for n in public_methods(a)}
        assert names <= set(dir(s)), (s, names - set(dir(s)))


def test_same_signatures():
    for a, s in PAIRS:
        for name in public_methods(a):
            assert inspect.signature(getattr(a, name)) == inspect.signature(getattr(s, name)), name


def test_public_names():
    assert set(dsec.__all__) == {
        "AsyncClient", "Client", "AsyncSandbox", "Sandbox", "AsyncShell", "Shell",
        "SandboxSpec", "SandboxInfo", "ExecResult", "ExecEvent", "FileInfo", "FnCallResult",
        "DSecError", "NotFound", "InvalidArgument", "Unauthorized", "Capacity",
        "SandboxTimeout", "SandboxStopped", "Unsupported", "Conflict", "TrajectoryDiverged",
        "Unavailable", "NodeLost", "RemoteError", "Internal"}
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
