"""The SDK's error boundary: only :class:`~dsec.DSecError` leaves a public method.

Drawn once, here, instead of at every call site: :func:`guarded` wraps each public
coroutine and async generator of an SDK class, so a new method is covered the day it is
written. Inside, :func:`translate` maps what the libraries underneath raise (httpx's
transport errors, pydantic's validation errors, a JSON decoder meeting a proxy's HTML page,
a local file that is missing) to the one tree, chained with ``raise ... from``.
"""

from __future__ import annotations

import functools
import inspect
import json
import tarfile
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import httpx
import pydantic

from dsec.api.errors import (DSecError, Internal, InvalidArgument, NotFound, SandboxTimeout,
                             Unavailable, error_from_wire)
from dsec.api.models import describe

__all__ = ["guarded", "translate", "parse", "parse_obj", "raise_for_status", "json_body",
           "lines"]

C = TypeVar("C", bound=type)


def translate(exc: BaseException, where: str, url: str = "") -> BaseException:
    """The :class:`DSecError` that stands for ``exc`` (raised while doing ``where``).

    Cancellation, KeyboardInterrupt and the like are not errors of the call: they pass."""
    if isinstance(exc, DSecError) or not isinstance(exc, Exception):
        return exc
    server = f"the dsec server at {url}" if url else "the dsec server"
    if isinstance(exc, httpx.TimeoutException):
        return SandboxTimeout(f"{where} got no answer in time: {exc!r}")
    if isinstance(exc, (httpx.ConnectError, ConnectionRefusedError)):
        return Unavailable(f"cannot reach {server} ({exc}); is it running? "
                           "(make run, or set DSEC_URL)")
    if isinstance(exc, (httpx.ProtocolError, httpx.DecodingError)):
        return Unavailable(f"{where}: {server} did not answer HTTP as dsec does ({exc}); "
                           "is DSEC_URL the address of a dsec server?")
    if isinstance(exc, (httpx.TransportError, ConnectionError)):
        return Unavailable(f"{where}: the connection to {server} failed ({exc!r}); "
                           "is it running? (make run, or set DSEC_URL)")
    if isinstance(exc, httpx.InvalidURL):
        return InvalidArgument(f"the server URL {url!r} is not a valid URL: {exc}")
    if isinstance(exc, pydantic.ValidationError):
        return InvalidArgument(describe(exc))
    if isinstance(exc, tarfile.TarError):
        return Internal(f"{where}: the server's answer is not a tar archive ({exc})")
    if isinstance(exc, FileNotFoundError):
        return NotFound(f"{where}: local file {exc.filename!r} does not exist")
    if isinstance(exc, OSError):
        return InvalidArgument(f"{where}: local file {exc.filename!r}: {exc.strerror or exc}")
    return Internal(f"{where} failed unexpectedly in the SDK ({type(exc).__name__}: {exc})")


def _url_of(obj: Any) -> str:
    client = getattr(obj, "_client", obj)
    return str(getattr(client, "url", ""))


@functools.cache
def _signature(fn: Callable) -> tuple[inspect.Signature, str]:
    """``fn``'s signature, and how it reads to a caller: no ``self``, no annotations."""
    sig = inspect.signature(fn)
    shown = sig.replace(parameters=[p.replace(annotation=p.empty)
                                    for p in list(sig.parameters.values())[1:]],
                        return_annotation=sig.empty)
    return sig, str(shown)


def _wrong_call(exc: Exception, name: str, fn: Callable, args: tuple,
                kwargs: dict) -> InvalidArgument | None:
    """The caller's error when ``exc`` is the TypeError of arguments that do not fit
    ``fn``; None otherwise (a TypeError from inside stays the SDK's own: Internal). Only
    asked after a TypeError, so a call that fits costs nothing more."""
    if not isinstance(exc, TypeError):
        return None
    sig, shown = _signature(fn)
    try:
        sig.bind(None, *args, **kwargs)
    except TypeError as wrong:
        return InvalidArgument(f"{wrong}; call it as {name}{shown}")
    return None


def _guard_coroutine(name: str, fn: Callable) -> Callable:
    @functools.wraps(fn)
    async def call(self, *args, **kwargs):
        try:
            return await fn(self, *args, **kwargs)
        except Exception as exc:
            err = _wrong_call(exc, name, fn, args, kwargs) or translate(exc, name,
                                                                        _url_of(self))
            if err is exc:
                raise
            raise err from exc
    return call


def _guard_generator(name: str, fn: Callable) -> Callable:
    @functools.wraps(fn)
    async def gen(self, *args, **kwargs):
        try:
            agen = fn(self, *args, **kwargs)  # arguments that do not fit fail here
        except TypeError as exc:
            raise (_wrong_call(exc, name, fn, args, kwargs) or translate(exc, name)) from exc
        try:
            async for item in agen:
                yield item
        except Exception as exc:
            err = translate(exc, name, _url_of(self))
            if err is exc:
                raise
            raise err from exc
        finally:
            await agen.aclose()
    return gen


def guarded(cls: C) -> C:
    """Class decorator: every public coroutine and async generator method of ``cls``
    raises nothing but :class:`DSecError` (and cancellation)."""
    for attr, fn in list(vars(cls).items()):
        if attr.startswith("_"):
            continue
        name = f"{cls.__name__.removeprefix('Async')}.{attr}"
        if inspect.isasyncgenfunction(fn):
            setattr(cls, attr, _guard_generator(name, fn))
        elif inspect.iscoroutinefunction(fn):
            setattr(cls, attr, _guard_coroutine(name, fn))
    return cls


def json_body(resp: httpx.Response) -> Any:
    """The response's JSON; a body that is not JSON is the server's fault, said so."""
    try:
        return json.loads(resp.content)
    except ValueError as exc:
        raise Internal(f"{resp.request.method} {resp.request.url.path}: the server answered "
                       f"HTTP {resp.status_code} with a body that is not JSON "
                       f"({resp.content[:80]!r})") from exc


@functools.lru_cache(maxsize=None)
def _adapter(model: Any) -> pydantic.TypeAdapter:
    return pydantic.TypeAdapter(model)


def _name(model: Any) -> str:
    return getattr(model, "__name__", None) or str(model)


def parse(model: Any, resp: httpx.Response) -> Any:
    """The response body as ``model`` (a model class or a type such as
    ``list[ImageSummary]``); an answer of another shape raises :class:`Internal` (a server
    of another version, or not dsec at all), never pydantic's error."""
    try:
        return _adapter(model).validate_json(resp.content)
    except pydantic.ValidationError as exc:
        raise Internal(f"{resp.request.method} {resp.request.url.path}: the server's answer "
                       f"is not a {_name(model)}: {describe(exc)}") from exc


def parse_obj(model: Any, obj: Any, what: str) -> Any:
    """``obj`` (already decoded JSON) as ``model``, failing like :func:`parse`."""
    try:
        return _adapter(model).validate_python(obj)
    except pydantic.ValidationError as exc:
        raise Internal(f"{what}: the server's answer is not a {_name(model)}: "
                       f"{describe(exc)}") from exc


async def raise_for_status(resp: httpx.Response) -> None:
    """Raise the error an answer of status 400 or more carries (any body shape)."""
    if resp.status_code < 400:
        return
    await resp.aread()
    try:
        body: object = json.loads(resp.content)
    except ValueError:
        body = resp.text[:500]
    err = error_from_wire(body, resp.status_code)
    rid = resp.headers.get("x-request-id")
    if rid and resp.status_code >= 500:  # the line to look for in the server's log
        err.message += f" (request {rid})"
        err.args = (err.message,)
    raise err


async def lines(resp: httpx.Response) -> AsyncIterator[dict]:
    """NDJSON objects of a streamed answer; a line that is not a JSON object is an error."""
    async for line in resp.aiter_lines():
        if not line:
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise Internal(f"the server's stream holds a line that is not JSON "
                           f"({line[:80]!r})") from exc
        if not isinstance(obj, dict):
            raise Internal(f"the server's stream holds a line that is not an object "
                           f"({line[:80]!r})")
        yield obj
