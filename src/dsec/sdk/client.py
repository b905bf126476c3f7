"""The asynchronous SDK client: the one place the HTTP API is spoken from Python."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import httpx

from dsec.api.errors import InvalidArgument, NodeLost, error_from_wire
from dsec.api.fncall import (FnCallBatch, FnCallBatchResult, FnCallRequest, FnCallResult,
                             Language)
from dsec.api.models import (CreateManyRequest, CreateManyResponse, ImageSummary, NodeInfo,
                             SandboxInfo, SandboxList, SandboxSpec, validated)
from dsec.sdk.boundary import guarded, lines, parse, raise_for_status, translate
from dsec.sdk.jobs import AsyncJobs
from dsec.sdk.listing import Listing
from dsec.sdk.projects import AsyncProjects
from dsec.sdk.sandbox import AsyncSandbox
from dsec.sdk.transport import FastTransport

__all__ = ["AsyncClient", "default_url", "default_token"]


def _state_dir() -> Path:
    return Path(os.environ.get("DSEC_STATE_DIR", "/var/lib/dsec"))


def default_url() -> str:
    """DSEC_URL, else the URL the local server wrote, else the default port on loopback."""
    if os.environ.get("DSEC_URL"):
        return os.environ["DSEC_URL"].rstrip("/")
    try:
        return (_state_dir() / "url").read_text().strip().rstrip("/")
    except OSError:
        return "http://127.0.0.1:7070"


def default_token() -> str | None:
    """DSEC_TOKEN, else the local server's token file when this user can read it."""
    if os.environ.get("DSEC_TOKEN"):
        return os.environ["DSEC_TOKEN"]
    try:
        return (_state_dir() / "token").read_text().strip()
    except OSError:
        return None


_DIRECT = frozenset({"json", "timeout"})  # what AsyncClient._direct sends itself
_DEFAULT = object()
_URLS_KEPT = 4096  # request URLs (and timeouts) kept parsed per client; then started over


def _kept(cache: dict, key: Any, make: Callable[[], Any]) -> Any:
    """``cache[key]``, made on first use; a full cache starts over (bounded, no LRU)."""
    if (value := cache.get(key)) is None:
        if len(cache) >= _URLS_KEPT:
            cache.clear()
        value = cache[key] = make()
    return value


@guarded
class AsyncClient:
    """Talks to a dsec gateway. ``async with AsyncClient() as c: sb = await c.create()``."""

    url: str
    jobs: AsyncJobs

    def __init__(self, url: str | None = None, token: str | None = None,
                 timeout: float = 120.0) -> None:
        self.url = (url or default_url()).rstrip("/")
        self._token = token if token is not None else default_token()
        headers = {"authorization": f"Bearer {self._token}"} if self._token else {}
        self._transport = FastTransport(max_connections=256)
        self._http = httpx.AsyncClient(base_url=self.url, headers=headers,
                                       timeout=httpx.Timeout(timeout, connect=10.0),
                                       transport=self._transport)
        self._timeout = self._http.timeout.as_dict()
        # parsed once, not per request (URL parsing was an eighth of the client's CPU
        # per exec with 64 in flight): a sandbox's paths recur, and so do timeouts
        self._urls: dict[str, httpx.URL] = {}
        self._timeouts: dict[Any, dict] = {}
        self.jobs = AsyncJobs(self)
        self.projects = AsyncProjects(self)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the HTTP connections. Sandboxes keep running."""
        await self._http.aclose()

    # ---- transport ----
    async def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        if self._http.is_closed:
            raise InvalidArgument("this client is closed (by close() or at the end of its "
                                  "`with` block); make a new one")
        try:
            if kw.keys() <= _DIRECT:
                resp = await self._direct(method, path, **kw)
            else:
                resp = await self._http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise translate(exc, f"{method} {path}", self.url) from exc
        await raise_for_status(resp)
        return resp

    async def _direct(self, method: str, path: str, json: Any = None,
                      timeout: Any = _DEFAULT) -> httpx.Response:
        """A request with at most a JSON body, straight to the transport: httpx's client
        layers (URL merging, cookies, auth and redirect handling), which dsec's API never
        needs, were half of this process's CPU per exec with 64 in flight. The headers
        are the client's own, so the server sees the same request."""
        t = self._timeout if timeout is _DEFAULT else self._timeout_of(timeout)
        url = _kept(self._urls, path, lambda: httpx.URL(self.url + path))
        req = httpx.Request(method, url, headers=self._http.headers, json=json,
                            extensions={"timeout": t})
        resp = await self._transport.handle_async_request(req)
        resp.request = req
        try:
            await resp.aread()
        finally:
            await resp.aclose()
        return resp

    def _timeout_of(self, timeout: Any) -> dict:
        """httpx's timeout dict for a per-request ``timeout`` (a number or None)."""
        if not isinstance(timeout, (int, float, type(None))):
            return httpx.Timeout(timeout).as_dict()
        return _kept(self._timeouts, timeout, lambda: httpx.Timeout(timeout).as_dict())

    async def _stream_lines(self, path: str, body: dict | None, method: str = "POST",
                            params: dict | None = None) -> AsyncIterator[dict]:
        if self._http.is_closed:
            raise InvalidArgument("this client is closed; make a new one")
        try:
            async with self._http.stream(method, path, json=body, params=params,
                                         timeout=None) as resp:
                await raise_for_status(resp)
                async for line in lines(resp):
                    yield line
        except httpx.HTTPError as exc:
            raise translate(exc, f"{method} {path}", self.url) from exc

    # ---- sandboxes ----
    async def create(self, backend: Literal["container", "microvm", "vm", "fncall"] = "container",
                     image: str = "busybox", *, layers: list[str] | None = None,
                     cpu: float = 1.0, memory_mb: int = 512, disk_mb: int = 1024,
                     pids: int = 512, ttl_s: float | None = 3600.0,
                     idle_ttl_s: float | None = None, on_idle: str = "stop",
                     idle_reclaim_s: float | None = None,
                     cpu_class: Literal["latency", "best_effort"] = "latency",
                     network: str | dict[str, bool] = "none", job: str | None = None,
                     labels: dict[str, str] | None = None,
                     env: dict[str, str] | None = None,
                     request_id: str | None = None,
                     protected_paths: list[str] | None = None, wait_s: float = 0.0,
                     project: str | None = None) -> AsyncSandbox:
        """Create one sandbox and return it running. A ``request_id`` makes the call safe
        to retry: the same key returns the sandbox the first attempt made.
        ``protected_paths`` are hierarchies no command may read or write (root included);
        only ``exec(..., grading=True)`` reaches them. ``wait_s`` lets it wait (in line,
        per project) for quota or room before it raises :class:`QuotaExceeded` or
        :class:`Capacity`. ``project``: the token's own by default, or one below it."""
        spec = _spec(locals())
        # only what was given: a server of an older version knows no newer fields
        resp = await self._request("POST", "/v1/sandboxes",
                                   json=spec.model_dump(exclude_unset=True))
        return AsyncSandbox(self, parse(SandboxInfo, resp))

    async def create_many(self, count: int,
                          backend: Literal["container", "microvm", "vm", "fncall"] = "container",
                          image: str = "busybox", *, layers: list[str] | None = None,
                          cpu: float = 1.0, memory_mb: int = 512, disk_mb: int = 1024,
                          pids: int = 512, ttl_s: float | None = 3600.0,
                          idle_ttl_s: float | None = None, on_idle: str = "stop",
                          idle_reclaim_s: float | None = None,
                          cpu_class: Literal["latency", "best_effort"] = "latency",
                          network: str | dict[str, bool] = "none", job: str | None = None,
                          labels: dict[str, str] | None = None,
                          env: dict[str, str] | None = None,
                          request_id: str | None = None,
                          protected_paths: list[str] | None = None, wait_s: float = 0.0,
                          project: str | None = None) -> list[AsyncSandbox]:
        """Create ``count`` sandboxes in one request, spread over the cluster's nodes and
        started concurrently there.

        Raises the first error only when none could be created; otherwise returns those
        that were (check ``len``). A ``request_id`` makes the call safe to retry: a retry
        returns what the first attempt made and makes only what is still missing."""
        args = dict(locals())
        args.pop("count")
        args.pop("request_id")
        extra = {"request_id": request_id} if request_id is not None else {}
        req = validated(CreateManyRequest, count=count, spec=_spec(args), **extra)
        resp = await self._request("POST", "/v1/sandboxes/batch",
                                   json=req.model_dump(exclude_unset=True), timeout=None)
        body = parse(CreateManyResponse, resp)
        made = [AsyncSandbox(self, s) for s in body.sandboxes]
        if not made and body.errors:
            first = body.errors[0]  # "item 3: quota_exceeded: ..." names its error's code
            code = first.split(": ", 2)[1] if first.count(": ") >= 2 else "capacity"
            raise error_from_wire({"error": {"code": code, "message": first}}, 429)
        return made

    async def get(self, sandbox_id: str) -> AsyncSandbox:
        """The sandbox with this id (it may have been created by another client)."""
        resp = await self._request("GET", f"/v1/sandboxes/{sandbox_id}")
        return AsyncSandbox(self, parse(SandboxInfo, resp))

    async def attach(self, sandbox_id: str) -> AsyncSandbox:
        """Reconnect to a running sandbox, e.g. after the trainer was preempted."""
        return await self.get(sandbox_id)

    async def list(self, job: str | None = None,
                   labels: dict[str, str] | None = None) -> Listing[SandboxInfo]:
        """Sandboxes, optionally only a job's or those carrying every given label. On a
        cluster, nodes that did not answer are named in the result's ``unreachable``
        (their sandboxes are not in it)."""
        params: list[tuple[str, str]] = []
        if job is not None:
            params.append(("job", job))
        params += [("label", f"{k}={v}") for k, v in (labels or {}).items()]
        resp = await self._request("GET", "/v1/sandboxes", params=params)
        page = parse(SandboxList, resp)
        return Listing(page.sandboxes, page.unreachable)

    async def images(self) -> list[ImageSummary]:
        """Images (tags) the server knows."""
        resp = await self._request("GET", "/v1/images")
        return parse(list[ImageSummary], resp)

    async def remove_image(self, name: str) -> None:
        """Untag an image; its layers go too unless another image or a sandbox keeps them
        (e.g. a ``pack_diff`` snapshot no longer needed)."""
        await self._request("DELETE", f"/v1/images/{quote(name, safe='/:@')}")

    async def nodes(self) -> list[NodeInfo]:
        """Nodes of the cluster with their load; one the gateway counts lost has
        ``healthy=False``, its last answer's figures and ``problem`` (why)."""
        resp = await self._request("GET", "/v1/nodes")
        return parse(list[NodeInfo], resp)

    async def stop_all(self, job: str | None = None) -> int:
        """Stop every sandbox (of ``job``, if given); returns how many were stopped.
        Raises :class:`NodeLost`, after stopping the others, when nodes of the cluster did
        not answer: their sandboxes were not stopped (call it again when they are back)."""
        infos = await self.list(job=job)
        gate = asyncio.Semaphore(32)  # thousands at once would only queue up on the server

        async def stop(sb_id: str) -> None:
            async with gate:
                await self._request("DELETE", f"/v1/sandboxes/{sb_id}")
        await asyncio.gather(*(stop(i.id) for i in infos))
        if infos.unreachable:
            raise NodeLost(f"stopped {len(infos)} sandboxes, but node(s) "
                           f"{', '.join(infos.unreachable)} did not answer: their sandboxes "
                           "were not stopped; call stop_all again when they are back")
        return len(infos)

    # ---- stateless calls (the fncall backend) ----
    async def fncall(self, fn: str | Callable[..., Any], *args: Any,
                     language: Language = "python", image: str = "python:3.11",
                     kwargs: dict[str, Any] | None = None, argv: list[str] | None = None,
                     stdin: bytes | str | None = None, files: dict[str, bytes] | None = None,
                     return_files: list[str] | None = None, env: dict[str, str] | None = None,
                     timeout: float = 10.0, cpu_time_s: float | None = None,
                     memory_mb: int = 256, disk_mb: int = 64, pids: int = 64,
                     max_output: int = 1 << 20,
                     compile_args: list[str] | None = None) -> Any:
        """Run ``fn`` once in a clean, pooled, isolated worker.

        ``fn`` as source code in ``language`` returns a :class:`FnCallResult` (exit code,
        output, ``files`` named in ``return_files``). ``fn`` as a Python callable is sent by
        value with ``args`` and ``kwargs`` and its return value comes back; an exception
        inside raises :class:`RemoteError` carrying the remote traceback."""
        req = _fncall_request(fn, args, kwargs, dict(
            language=language, image=image, argv=argv or [], stdin=stdin, files=files or {},
            return_files=return_files or [], env=env or {}, timeout=timeout,
            cpu_time_s=cpu_time_s, memory_mb=memory_mb, disk_mb=disk_mb, pids=pids,
            max_output=max_output, compile_args=compile_args or []))
        resp = await self._request("POST", "/v1/fncall", json=req.model_dump(mode="json"),
                                   timeout=timeout + 60)
        out = parse(FnCallResult, resp)
        return out.result() if callable(fn) else out

    async def fncall_many(self, calls: list[str | FnCallRequest | Callable[..., Any]], *,
                          language: Language = "python", image: str = "python:3.11",
                          timeout: float = 10.0, memory_mb: int = 256,
                          disk_mb: int = 64) -> list[FnCallResult]:
        """Many calls in one request, run concurrently; results in the same order.

        Each item is source code (in ``language``), a ready :class:`FnCallRequest` (its own
        options win), or a callable taking no arguments (use ``.result()`` on its result)."""
        common = dict(language=language, image=image, timeout=timeout, memory_mb=memory_mb,
                      disk_mb=disk_mb)
        reqs = [c if isinstance(c, FnCallRequest) else _fncall_request(c, (), None, common)
                for c in calls]
        batch = validated(FnCallBatch, calls=reqs)
        resp = await self._request("POST", "/v1/fncall/batch",
                                   json=batch.model_dump(mode="json"), timeout=None)
        return parse(FnCallBatchResult, resp).results


def _fncall_request(fn: Any, args: tuple, kwargs: dict[str, Any] | None,
                    options: dict[str, Any]) -> FnCallRequest:
    if isinstance(options.get("stdin"), str):
        options["stdin"] = options["stdin"].encode()
    if isinstance(fn, str):
        if args or kwargs:
            raise InvalidArgument("arguments go with a callable; pass argv=[...] to code")
        return validated(FnCallRequest, code=fn, **options)
    if not callable(fn):
        raise InvalidArgument(f"fncall takes source code or a callable; got "
                              f"{type(fn).__name__}")
    import cloudpickle
    try:
        payload = cloudpickle.dumps((fn, args, kwargs or {}))
    except Exception as exc:  # a lambda over a socket, a lock, ...: cannot be sent
        raise InvalidArgument(f"cannot send {fn!r} by value: {type(exc).__name__}: {exc}") \
            from exc
    return validated(FnCallRequest, callable=payload, **options)


def _spec(args: dict) -> SandboxSpec:
    fields = {k: v for k, v in args.items() if k != "self" and v is not None
              and k in SandboxSpec.model_fields}
    for k in ("ttl_s", "idle_ttl_s"):
        fields[k] = args.get(k)
    return validated(SandboxSpec, **fields)
