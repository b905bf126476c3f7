"""The blocking face of the SDK, generated from the async classes rather than copied.

Each sync class wraps its async twin: every public coroutine method becomes a blocking
method with the same name and signature, running on one background event loop; async
iterators become iterators; returned async handles come back wrapped in their sync class.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import re
import threading
from collections.abc import Iterator
from typing import Any

from dsec.sdk.client import AsyncClient
from dsec.sdk.jobs import AsyncJobs
from dsec.sdk.process import AsyncProcess
from dsec.sdk.projects import AsyncProjects
from dsec.sdk.pty import AsyncPty
from dsec.sdk.sandbox import AsyncFiles, AsyncInput, AsyncSandbox, AsyncShell

__all__ = ["Client", "Sandbox", "Shell", "Files", "Input", "Jobs", "Process", "Pty", "Projects",
           "sync_annotation", "sync_signature"]


class _Loop:
    """One event loop in a daemon thread, shared by every sync client."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def get(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._loop is None:
                cls._loop = asyncio.new_event_loop()
                threading.Thread(target=cls._loop.run_forever, name="dsec-sdk",
                                 daemon=True).start()
            return cls._loop


def _run(coro) -> Any:
    return asyncio.run_coroutine_threadsafe(coro, _Loop.get()).result()


def _iterate(agen) -> Iterator:
    loop = _Loop.get()
    pending = None
    try:
        while True:
            pending = asyncio.run_coroutine_threadsafe(agen.__anext__(), loop)
            try:
                item = pending.result()
            except StopAsyncIteration:
                return
            pending = None
            yield item
    finally:
        if pending is not None and not pending.done():
            # interrupted mid-step (e.g. Ctrl-C): cancel the step before closing the stream
            pending.cancel()
            try:
                pending.result(timeout=5)
            except BaseException:
                pass
        try:
            asyncio.run_coroutine_threadsafe(agen.aclose(), loop).result(timeout=10)
        except RuntimeError:
            pass


_WRAPPERS: dict[type, type] = {}
_NAME = re.compile(r"\b(Async(?:Client|Sandbox|Shell|Files|Input|Jobs|Process|Pty))\b")


def sync_annotation(annotation: Any) -> Any:
    """An async face's annotation (a string, under ``from __future__ import annotations``)
    as the blocking face has it: ``AsyncSandbox`` -> ``Sandbox``, ``AsyncIterator[X]`` ->
    ``Iterator[X]``."""
    if not isinstance(annotation, str):
        return annotation
    text = re.sub(r"\bAsyncIterator\[", "Iterator[", annotation)
    return _NAME.sub(lambda m: m.group(1).removeprefix("Async"), text)


def sync_signature(fn: Any) -> inspect.Signature:
    """The signature the blocking face gives the async method ``fn``."""
    sig = inspect.signature(fn)
    params = [p.replace(annotation=sync_annotation(p.annotation))
              for p in sig.parameters.values()]
    return sig.replace(parameters=params,
                       return_annotation=sync_annotation(sig.return_annotation))


def _wrap(value: Any) -> Any:
    cls = _WRAPPERS.get(type(value))
    if cls is not None:
        return cls._from_async(value)
    if isinstance(value, list) and value and type(value[0]) in _WRAPPERS:
        return [_wrap(v) for v in value]
    return value


def _sync_method(name: str, fn):
    if inspect.isasyncgenfunction(fn):
        @functools.wraps(fn)
        def gen(self, *args, **kwargs):
            return _iterate(getattr(self._async, name)(*args, **kwargs))
        gen.__signature__ = sync_signature(fn)  # type: ignore[attr-defined]
        return gen

    @functools.wraps(fn)
    def call(self, *args, **kwargs):
        return _wrap(_run(getattr(self._async, name)(*args, **kwargs)))
    call.__signature__ = sync_signature(fn)  # type: ignore[attr-defined]
    return call


def _sync_class(async_cls: type, name: str, doc: str) -> type:
    ns: dict[str, Any] = {"__doc__": doc}
    for attr, fn in vars(async_cls).items():
        if attr.startswith("_"):
            continue
        if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
            ns[attr] = _sync_method(attr, fn)

    @classmethod
    def _from_async(cls, obj):
        self = cls.__new__(cls)
        self._async = obj
        return self

    def __getattr__(self, item):  # plain attributes (id, info, files) pass through
        return _wrap(getattr(self._async, item))

    def __repr__(self):
        return repr(self._async)

    ns.update(_from_async=_from_async, __getattr__=__getattr__, __repr__=__repr__)
    cls = type(name, (), ns)
    _WRAPPERS[async_cls] = cls
    return cls


Files = _sync_class(AsyncFiles, "Files", AsyncFiles.__doc__ or "")
Process = _sync_class(AsyncProcess, "Process", AsyncProcess.__doc__ or "")
Pty = _sync_class(AsyncPty, "Pty", AsyncPty.__doc__ or "")
Input = _sync_class(AsyncInput, "Input", AsyncInput.__doc__ or "")
Jobs = _sync_class(AsyncJobs, "Jobs", AsyncJobs.__doc__ or "")
Projects = _sync_class(AsyncProjects, "Projects", AsyncProjects.__doc__ or "")
Shell = _sync_class(AsyncShell, "Shell", AsyncShell.__doc__ or "")
Sandbox = _sync_class(AsyncSandbox, "Sandbox", AsyncSandbox.__doc__ or "")
_ClientBase = _sync_class(AsyncClient, "_ClientBase", "")


class Client(_ClientBase):  # type: ignore[misc, valid-type]
    """Blocking client: ``with dsec.Client() as c: sb = c.create()``; the async client's
    methods, each returning its result (and blocking handles) instead of a coroutine."""

    def __init__(self, url: str | None = None, token: str | None = None,
                 timeout: float = 120.0) -> None:
        async def make() -> AsyncClient:
            return AsyncClient(url, token, timeout)
        self._async = _run(make())

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
