"""A node agent on another machine, behind the NodeClient interface, over its HTTP API.

The node's API is the gateway app over that node alone, so each verb here is one request
to the same route a user would call. Bodies stream both ways. Failures to reach the node
become :class:`NodeLost` naming it (a short connect timeout; a dead node's port refuses at
once). Such an error says whether the request was sent at all (``sent``): one that never
left may be placed elsewhere. The load probe has no connect limit of its own: the
watcher's budget bounds it, and the watcher, not one slow connect, decides liveness.
Keep-alive: this client drops an idle connection well before the node's server would
(``KEEPALIVE_S`` < the node's ``timeout_keep_alive``), so a request is never written onto
a connection the node is closing; a request that may be repeated safely (GET, DELETE, the
load probe) is retried once on a connection that turned out stale.

A node's answers are not trusted blindly: one that does not parse as what a dsec node
sends, or that names a sandbox of another node, ends the request with :class:`NodeLost`
naming the node (never a 500, never another node's sandbox handed on), and the watcher
is told (``on_untrusted``), so the node gets no requests for a while.

A node's answer to a create carries what it holds as it answers (:data:`LOAD_HEADER`),
passed to the watcher (``on_counts``): between its probes, a gateway so sees the nodes it
places on with the other gateways' placements on them.
"""

from __future__ import annotations

import functools
import inspect
import json
import time
from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar
from urllib.parse import quote

import httpx

from dsec.api.errors import DSecError, NodeLost, NotFound, error_from_wire
from dsec.api.fncall import FnCallBatch, FnCallBatchResult, FnCallRequest, FnCallResult
from dsec.api.models import (CreateManyRequest, ExecEvent, ExecRequest, ExecResult, FileInfo,
                             FileList, ImageSummary, InputRequest, NodeInfo, PackDiffRequest,
                             SandboxInfo, SandboxList, SandboxSpec, ShellInfo, ShellRunRequest)
from dsec.api.process import (ProcessInfo, ProcessList, ProcessRequest, ProcessWaitRequest,
                              PtySize, SignalRequest, StdinRequest, TimeoutRequest)
from dsec.api.rl import (HeartbeatRequest, JobList, NetworkRequest, NetworkStatus,
                         SandboxAuditList, TrajectoryPage)
from dsec.api.tracing import REQUEST_ID
from dsec.api.scope import SCOPE_HEADER, caller_scope
from dsec.gateway import metrics
from dsec.placement.admission import NodeLoad
from dsec.sdk.transport import FastTransport

__all__ = ["HttpNodeClient", "KEEPALIVE_S", "LOAD_HEADER", "NODE_KEEPALIVE_S", "counts_header",
           "counts_from_header", "load_to_wire"]

KEEPALIVE_S = 4.0        # this client forgets an idle connection after this long...
NODE_KEEPALIVE_S = 30.0  # ...well before a node's server closes one (uvicorn's setting)
# Not 1 s: that is TCP's first SYN retransmission, and on a loaded machine a gateway's own
# event loop can lag past it, so a 1 s limit failed connects to nodes that were fine.
CONNECT_S = 3.0
IDEMPOTENT = {"GET", "HEAD", "DELETE", "PUT"}
STALE = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


# set once the node's answer to the request under way came back (see _checked)
_ANSWERED: ContextVar[bool] = ContextVar("dsec_node_answered", default=False)


def _makes_sandboxes(request) -> bool:
    """Whether a request in flight makes sandboxes (a create or a batch)."""
    return request.method == "POST" and request.url.path.rstrip("/").endswith(
        ("/v1/sandboxes", "/v1/sandboxes/batch"))


# A node's answer to a create carries what it holds as it answers: "<sandboxes>
# <memory_reserved_mb> <cpu_reserved>". The gateway takes it as a fresh look at that node,
# the other gateways' placements on it included, at no request of its own.
LOAD_HEADER = "x-dsec-node-load"
_LOAD_HEADER = LOAD_HEADER.encode()
_MAX_COUNT = 1 << 40


def counts_header(load: NodeLoad) -> str:
    return f"{load.sandboxes} {load.memory_reserved_mb} {load.cpu_reserved:.3f}"


def counts_from_header(value: bytes | str) -> tuple[int, int, float] | None:
    """(sandboxes, memory_reserved_mb, cpu_reserved) from :data:`LOAD_HEADER`'s value;
    None for anything else (a node's figures steer placement only when they make sense).
    Pure."""
    try:
        n, mem, cpu = value.split()
        sandboxes, memory, cores = int(n), int(mem), float(cpu)
    except (ValueError, TypeError, AttributeError):
        return None
    if not (0 <= sandboxes < _MAX_COUNT and 0 <= memory < _MAX_COUNT and 0 <= cores < _MAX_COUNT):
        return None  # also NaN, which compares false
    return sandboxes, memory, cores


def load_to_wire(load: NodeLoad) -> dict:
    return {**vars(load), "backends": list(load.backends)}  # asdict deep-copies: 4x slower


def _load_from_wire(d: dict) -> NodeLoad:
    return NodeLoad(**{**d, "backends": tuple(d["backends"])})


class _Stream:
    """A response body not read yet (a file or a tar coming from the node)."""

    def __init__(self, resp: httpx.Response) -> None:
        self.resp = resp
        length = resp.headers.get("content-length")
        self.size = int(length) if length and length.isdigit() else None

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self.resp.aiter_raw():
                yield chunk
        finally:
            await self.resp.aclose()


class _WsPty:
    """A terminal on the node, relayed over its WebSocket."""

    def __init__(self, ws) -> None:
        self.ws = ws

    async def send(self, data: bytes) -> None:
        await self.ws.send(data)

    async def resize(self, rows: int, cols: int) -> None:
        await self.ws.send(json.dumps({"resize": [rows, cols]}))

    async def receive(self) -> bytes | int:
        msg = await self.ws.recv()
        if isinstance(msg, bytes):
            return msg
        body = json.loads(msg)
        if "exit" in body:
            return int(body["exit"]) if body["exit"] is not None else -1
        raise error_from_wire(body, 500)

    async def close(self) -> None:
        await self.ws.close()


class HttpNodeClient:
    """One remote node agent: ``url`` of its API, ``token`` the cluster credential."""

    in_process = False

    def __init__(self, node_id: str, url: str, token: str, max_connections: int = 256) -> None:
        self.node_id, self.url, self.token = node_id, url.rstrip("/"), token
        self.short = node_id.removeprefix("node-")
        # when the node last answered anything (time.monotonic, the watcher's clock): the
        # watcher tells a busy node (slow probes, other answers) from a hung one by it
        self.answered_at: float | None = None
        self.lost = False  # the watcher gave up on the node: no retries, no waiting on it
        self.aborted = False  # ...and ended its creates in flight too
        # told (node id, why) when the node answers what no dsec node sends
        self.on_untrusted: Callable[[str, str], None] | None = None
        # told (node id, its counts, when the request was sent) when a create's answer
        # says what the node holds (LOAD_HEADER)
        self.on_counts: Callable[[str, tuple[int, int, float], float], None] | None = None
        # the SDK's transport: httpcore's pool costs ~0.5 ms of CPU per request (more with
        # many in flight), which was most of what the gateway added to a request
        self._transport = FastTransport(max_connections=max_connections,
                                        keepalive_expiry=KEEPALIVE_S)
        self._headers = httpx.Headers({"authorization": f"Bearer {token}"})
        self._raw = [(b"authorization", f"Bearer {token}".encode("latin-1"))]
        self._raw_json = [*self._raw, (b"content-type", b"application/json")]
        self._json_headers = httpx.Headers({**self._headers, "content-type": "application/json"})
        self._urls: dict[str, httpx.URL] = {}  # parsed once: parsing was ~25 µs a request
        self._timeout = httpx.Timeout(None, connect=CONNECT_S).as_dict()
        self._probe_timeout = httpx.Timeout(None).as_dict()  # the watcher's budget bounds it
        self.http = httpx.AsyncClient(base_url=self.url, headers=self._headers,
                                      timeout=httpx.Timeout(None, connect=CONNECT_S),
                                      transport=self._transport)

    def release(self) -> None:
        """The node was marked unhealthy: requests in flight to it end now with NodeLost
        (a hung node would otherwise hold them as long as it hangs; an exec has no read
        timeout, since a command may run for hours), except those that make sandboxes.
        A node merely slow with its share of a big batch can look hung for a while, and
        ending its creates would orphan what it makes: they wait for :meth:`abort`."""
        self.lost = True
        self._transport.abort(keep=_makes_sandboxes)

    def abort(self) -> None:
        """The node stayed silent (the watcher's ``abort_after_s``): everything in flight
        to it ends now with NodeLost, creates included."""
        self.lost = self.aborted = True
        self._transport.abort()

    def revive(self) -> None:
        """The node answers again."""
        self.lost = self.aborted = False

    # ---- transport ----
    def _lost(self, exc: Exception) -> NodeLost:
        err = NodeLost(f"node {self.node_id} at {self.url} does not answer "
                       f"({type(exc).__name__}); its sandboxes are reachable again when it "
                       "comes back")
        err.node_id = self.node_id
        err.why = f"{type(exc).__name__} at {self.url}"  # what the watcher tells later callers
        # a failed connect sent nothing: the caller may try another node
        err.sent = not isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout))
        return err

    def _untrusted(self, exc: Exception) -> NodeLost:
        why = f"answered what no dsec node sends ({type(exc).__name__}: {str(exc)[:200]})"
        err = NodeLost(f"node {self.node_id} at {self.url} {why}; it gets no requests "
                       "until it answers properly again")
        err.node_id, err.sent, err.why = self.node_id, True, why
        if self.on_untrusted is not None:
            self.on_untrusted(self.node_id, why)
        return err

    def _error(self, status: int, content: bytes) -> DSecError:
        """The error a node answered. Only a dsec error body is believed: anything else
        (a 401, which means the node refuses this gateway's cluster credential, not the
        caller's token; a proxy's page) is the node's failure."""
        if status == 401:
            return self._untrusted(PermissionError(
                "HTTP 401: it refuses this gateway's cluster credential"))
        try:
            body = json.loads(content)
        except ValueError:
            body = None
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            return error_from_wire(body, status)
        return self._untrusted(ValueError(f"HTTP {status} with no dsec error in it"))

    def _own(self, info: SandboxInfo) -> SandboxInfo:
        """``info`` if it is a sandbox of this node: a node naming another's is not
        believed (its answer would hand a caller a sandbox it never made)."""
        if info.node != self.node_id or not info.id.startswith(f"sb-{self.short}-"):
            raise ValueError(f"it answered with {info.id} of {info.node}, not one of its own")
        return info

    async def _send(self, method: str, path: str, stream: bool = False,
                    timeout: dict | None = None, **kw) -> httpx.Response:
        # Straight to the transport: the client's cookie, auth, redirect and URL-merging
        # layers cost about a fifth of the gateway's CPU per relayed request, and a node
        # answers none of them.
        kw.setdefault("headers", self._headers)
        req = httpx.Request(method, self._url(path),
                            extensions={"timeout": timeout or self._timeout}, **kw)
        if rid := REQUEST_ID.get():  # the node's log lines carry the gateway's request id
            req.headers["x-request-id"] = rid
        if (scope := caller_scope.get()) is not None:  # the node enforces the caller's
            req.headers[SCOPE_HEADER] = scope            # project, as the gateway's own does

        async def once() -> httpx.Response:
            resp = await self._transport.handle_async_request(req)
            if not stream:
                await resp.aread()
            return resp

        resp = await self._retried(once, method in IDEMPOTENT and (
            "content" not in kw or isinstance(kw["content"], bytes)))
        _ANSWERED.set(True)
        if resp.status_code >= 400:
            if stream:
                await resp.aread()
                await resp.aclose()
            raise self._error(resp.status_code, resp.content)
        return resp

    async def _call(self, method: str, path: str, body: bytes | None = None,
                    timeout: dict | None = None) -> bytes:
        """The body of the node's answer to a request with a whole body (JSON, or none):
        what :meth:`_send` does, on the transport's short path (no httpx Request or
        Response built: they were a tenth of the CPU of a relayed create)."""
        return (await self._exchange(method, path, body, timeout))[1]

    async def _exchange(self, method: str, path: str, body: bytes | None = None,
                        timeout: dict | None = None) -> tuple[list[tuple[bytes, bytes]], bytes]:
        """:meth:`_call`, with the answer's headers: (headers, body)."""
        headers = self._raw if body is None else self._raw_json
        if rid := REQUEST_ID.get():
            headers = [*headers, (b"x-request-id", rid.encode("latin-1"))]
        if (scope := caller_scope.get()) is not None:
            headers = [*headers, (SCOPE_HEADER.encode(), scope.encode("latin-1"))]
        status, head, content = await self._retried(lambda: self._transport.exchange(
            method, self._url(path), headers, body or b"", timeout or self._timeout),
            method in IDEMPOTENT)
        _ANSWERED.set(True)
        if status >= 400:
            raise self._error(status, content)
        return head, content

    async def _retried(self, once, resendable: bool):
        """``once()``, again once on a connection the node closed as it was reused when
        the request may be sent twice; any other transport failure is the node lost."""
        for attempt in (0, 1):
            try:
                out = await once()
                break
            except STALE as exc:
                if attempt or self.lost or not resendable:
                    raise self._lost(exc) from exc
                metrics.RETRIES.labels("stale_connection").inc()
            except httpx.TransportError as exc:
                raise self._lost(exc) from exc
        self.answered_at = time.monotonic()
        return out

    def _url(self, path: str) -> httpx.URL:
        url = self._urls.get(path)
        if url is None:
            if len(self._urls) >= 4096:  # paths name sandboxes: keep the cache bounded
                self._urls.clear()
            url = self._urls[path] = httpx.URL(self.url + path)
        return url

    def _ws_headers(self) -> dict[str, str]:
        headers = {"authorization": f"Bearer {self.token}"}
        if (scope := caller_scope.get()) is not None:
            headers[SCOPE_HEADER] = scope
        return headers

    async def _events(self, resp: httpx.Response) -> AsyncIterator[ExecEvent]:
        """The NDJSON events of a streamed answer; an error line raises its error."""
        try:
            async for line in resp.aiter_lines():
                self.answered_at = time.monotonic()  # a node streaming output is alive
                if line:
                    try:
                        body = json.loads(line)
                        failed = "error" in body and "type" not in body
                        event = None if failed else ExecEvent.model_validate(body)
                    except (ValueError, TypeError) as exc:
                        raise self._untrusted(exc) from exc
                    if failed:
                        raise error_from_wire(body, 500)
                    yield event
        except httpx.TransportError as exc:
            raise self._lost(exc) from exc
        finally:
            await resp.aclose()

    async def _json(self, method: str, path: str, **kw):
        if kw.keys() <= {"timeout"}:
            content = await self._call(method, path, timeout=kw.get("timeout"))
            return json.loads(content) if content else None
        resp = await self._send(method, path, **kw)
        return resp.json() if resp.content else None

    async def _model(self, model, method: str, path: str, body=None):
        """``model`` parsed from the node's answer (in Rust, straight from the bytes)."""
        content = None if body is None else body.model_dump_json().encode()
        return model.model_validate_json(await self._call(method, path, content))

    async def close(self) -> None:
        await self.http.aclose()

    # ---- the node ----
    async def load(self) -> NodeLoad:
        """The node's own load. No connect limit: the watcher's probe budget bounds it."""
        for d in await self._json("GET", "/v1/nodes/load", timeout=self._probe_timeout):
            if d["node_id"] == self.node_id:
                return _load_from_wire(d)
        raise NodeLost(f"node at {self.url} answered without its own load ({self.node_id})")

    async def node_info(self) -> NodeInfo:
        infos = [NodeInfo.model_validate(d) for d in await self._json("GET", "/v1/nodes")]
        for info in infos:
            if info.id == self.node_id:
                return info
        raise ValueError(f"its node list does not hold {self.node_id}")

    # ---- sandboxes ----
    async def create(self, spec: SandboxSpec) -> SandboxInfo:
        sent_at = time.monotonic()
        head, content = await self._exchange("POST", "/v1/sandboxes",
                                             spec.model_dump_json().encode())
        info = self._own(SandboxInfo.model_validate_json(content))
        if self.on_counts is not None:
            for name, value in head:
                if name.lower() == _LOAD_HEADER:
                    if (counts := counts_from_header(value)) is not None:
                        self.on_counts(self.node_id, counts, sent_at)
                    break
        return info

    async def create_many(self, count: int, spec: SandboxSpec, request_id: str | None = None,
                          first_index: int = 0) -> tuple[list[SandboxInfo], list[str]]:
        req = CreateManyRequest(count=count, spec=spec, request_id=request_id,
                                first_index=first_index)
        body = await self._json("POST", "/v1/sandboxes/batch", content=req.model_dump_json(),
                                headers=self._json_headers)
        errors = body["errors"]
        if not all(isinstance(e, str) for e in errors):
            raise TypeError("its batch errors are not strings")
        return [self._own(SandboxInfo.model_validate(s)) for s in body["sandboxes"]], errors

    async def list(self, job: str | None = None, labels: dict[str, str] | None = None,
                   request_id: str | None = None) -> list[SandboxInfo]:
        params: list[tuple[str, str]] = [("label", f"{k}={v}") for k, v in (labels or {}).items()]
        if job is not None:
            params.append(("job", job))
        if request_id is not None:
            params.append(("request_id", request_id))
        body = await self._json("GET", "/v1/sandboxes", params=params)
        return [self._own(info) for info in SandboxList.model_validate(body).sandboxes]

    async def get(self, sb_id: str) -> SandboxInfo:
        return self._own(await self._model(SandboxInfo, "GET", f"/v1/sandboxes/{sb_id}"))

    async def stop(self, sb_id: str) -> None:
        await self._send("DELETE", f"/v1/sandboxes/{sb_id}")

    async def pause(self, sb_id: str) -> SandboxInfo:
        return self._own(await self._model(SandboxInfo, "POST", f"/v1/sandboxes/{sb_id}/pause"))

    async def resume(self, sb_id: str) -> SandboxInfo:
        return self._own(await self._model(SandboxInfo, "POST",
                                           f"/v1/sandboxes/{sb_id}/resume"))

    async def set_timeout(self, sb_id: str, timeout_s: float) -> SandboxInfo:
        resp = await self._post_model(f"/v1/sandboxes/{sb_id}/timeout",
                                      TimeoutRequest(timeout_s=timeout_s))
        return self._own(SandboxInfo.model_validate_json(resp.content))

    # ---- commands ----
    async def _post_model(self, path: str, model) -> httpx.Response:
        return await self._send("POST", path, content=model.model_dump_json(),
                                headers=self._json_headers)

    async def exec(self, sb_id: str, req: ExecRequest) -> ExecResult:
        return await self._model(ExecResult, "POST", f"/v1/sandboxes/{sb_id}/exec", req)

    async def exec_stream(self, sb_id: str, req: ExecRequest) -> AsyncIterator[ExecEvent]:
        resp = await self._send("POST", f"/v1/sandboxes/{sb_id}/exec/stream", stream=True,
                                content=req.model_dump_json(),
                                headers=self._json_headers)
        async for ev in self._events(resp):
            yield ev

    # ---- background processes ----
    async def process_start(self, sb_id: str, req: ProcessRequest) -> ProcessInfo:
        resp = await self._post_model(f"/v1/sandboxes/{sb_id}/processes", req)
        return ProcessInfo.model_validate_json(resp.content)

    async def process_list(self, sb_id: str) -> list[ProcessInfo]:
        body = await self._json("GET", f"/v1/sandboxes/{sb_id}/processes")
        return ProcessList.model_validate(body).processes

    async def process_get(self, sb_id: str, pid: int) -> ProcessInfo:
        return ProcessInfo.model_validate(
            await self._json("GET", f"/v1/sandboxes/{sb_id}/processes/{pid}"))

    async def process_events(self, sb_id: str, pid: int, since: int
                             ) -> AsyncIterator[ExecEvent]:
        resp = await self._send("GET", f"/v1/sandboxes/{sb_id}/processes/{pid}/events",
                                stream=True, params={"since": since})
        async for ev in self._events(resp):
            yield ev

    async def process_wait(self, sb_id: str, pid: int, timeout: float | None) -> ProcessInfo:
        resp = await self._post_model(f"/v1/sandboxes/{sb_id}/processes/{pid}/wait",
                                      ProcessWaitRequest(timeout=timeout))
        return ProcessInfo.model_validate_json(resp.content)

    async def process_signal(self, sb_id: str, pid: int, signal: int) -> None:
        await self._post_model(f"/v1/sandboxes/{sb_id}/processes/{pid}/signal",
                               SignalRequest(signal=signal))

    async def process_stdin(self, sb_id: str, pid: int, req: StdinRequest) -> None:
        await self._post_model(f"/v1/sandboxes/{sb_id}/processes/{pid}/stdin", req)

    async def process_resize(self, sb_id: str, pid: int, size: PtySize) -> None:
        await self._post_model(f"/v1/sandboxes/{sb_id}/processes/{pid}/resize", size)

    async def shell_open(self, sb_id: str) -> ShellInfo:
        return ShellInfo.model_validate(await self._json("POST",
                                                         f"/v1/sandboxes/{sb_id}/shells"))

    async def shell_run(self, sb_id: str, sh_id: str, req: ShellRunRequest) -> ExecResult:
        return await self._model(ExecResult, "POST",
                                 f"/v1/sandboxes/{sb_id}/shells/{sh_id}/run", req)

    async def shell_close(self, sb_id: str, sh_id: str) -> None:
        await self._send("DELETE", f"/v1/sandboxes/{sb_id}/shells/{sh_id}")

    async def pty(self, sb_id: str, rows: int, cols: int) -> _WsPty:
        from websockets.asyncio.client import connect
        url = (self.url.replace("http", "ws", 1)
               + f"/v1/sandboxes/{sb_id}/pty?rows={rows}&cols={cols}")
        try:
            ws = await connect(url, additional_headers=self._ws_headers(),
                               open_timeout=10)
        except OSError as exc:
            raise self._lost(exc) from exc
        return _WsPty(ws)

    # ---- files ----
    @staticmethod
    def _fp(path: str, grading: bool, **more) -> dict:
        """File route parameters; ``grading`` only when set (the node trusts its gateway)."""
        return {"path": path, **more, **({"grading": "true"} if grading else {})}

    async def file_read(self, sb_id: str, path: str, grading: bool = False) -> _Stream:
        return _Stream(await self._send("GET", f"/v1/sandboxes/{sb_id}/files", stream=True,
                                        params=self._fp(path, grading)))

    async def file_write(self, sb_id: str, path: str, mode: int,
                         body: AsyncIterator[bytes], grading: bool = False) -> FileInfo:
        resp = await self._send("PUT", f"/v1/sandboxes/{sb_id}/files", content=body,
                                params=self._fp(path, grading, mode=mode))
        return FileInfo.model_validate(resp.json())

    async def file_stat(self, sb_id: str, path: str, grading: bool = False) -> FileInfo:
        return FileInfo.model_validate(await self._json(
            "GET", f"/v1/sandboxes/{sb_id}/files/stat", params=self._fp(path, grading)))

    async def file_list(self, sb_id: str, path: str, grading: bool = False) -> list[FileInfo]:
        return FileList.model_validate(await self._json(
            "GET", f"/v1/sandboxes/{sb_id}/files/list",
            params=self._fp(path, grading))).entries

    async def file_mkdir(self, sb_id: str, path: str, parents: bool,
                         grading: bool = False) -> FileInfo:
        return FileInfo.model_validate(await self._json(
            "POST", f"/v1/sandboxes/{sb_id}/files/mkdir",
            params=self._fp(path, grading, parents=str(parents).lower())))

    async def file_remove(self, sb_id: str, path: str, recursive: bool,
                          grading: bool = False) -> None:
        await self._send("DELETE", f"/v1/sandboxes/{sb_id}/files",
                         params=self._fp(path, grading, recursive=str(recursive).lower()))

    async def tar_read(self, sb_id: str, path: str,
                       grading: bool = False) -> AsyncIterator[bytes]:
        resp = await self._send("GET", f"/v1/sandboxes/{sb_id}/files/tar", stream=True,
                                params=self._fp(path, grading))
        return _Stream(resp).chunks()

    async def tar_write(self, sb_id: str, path: str, body: AsyncIterator[bytes],
                        grading: bool = False) -> int:
        resp = await self._send("PUT", f"/v1/sandboxes/{sb_id}/files/tar", content=body,
                                params=self._fp(path, grading))
        return int(resp.json()["entries"])

    # ---- snapshots, display, network, logs ----
    async def pack_diff(self, sb_id: str, req: PackDiffRequest) -> ImageSummary:
        resp = await self._post_model(f"/v1/sandboxes/{sb_id}/pack_diff", req)
        return ImageSummary.model_validate(resp.json())

    async def screenshot(self, sb_id: str) -> bytes:
        return (await self._send("GET", f"/v1/sandboxes/{sb_id}/screenshot")).content

    async def input(self, sb_id: str, req: InputRequest) -> None:
        await self._post_model(f"/v1/sandboxes/{sb_id}/input", req)

    async def network(self, sb_id: str) -> NetworkStatus:
        return NetworkStatus.model_validate(await self._json(
            "GET", f"/v1/sandboxes/{sb_id}/network"))

    async def set_network(self, sb_id: str, allow: dict[str, bool]) -> NetworkStatus:
        resp = await self._send("PUT", f"/v1/sandboxes/{sb_id}/network",
                                content=NetworkRequest(allow=allow).model_dump_json(),
                                headers=self._json_headers)
        return NetworkStatus.model_validate(resp.json())

    async def audit(self, sb_id: str):
        return SandboxAuditList.model_validate(await self._json(
            "GET", f"/v1/sandboxes/{sb_id}/audit")).records

    async def trajectory(self, sb_id: str, offset: int, limit: int) -> TrajectoryPage:
        return TrajectoryPage.model_validate(await self._json(
            "GET", f"/v1/sandboxes/{sb_id}/trajectory",
            params={"offset": offset, "limit": limit}))

    # ---- jobs: a job with nothing on this node is not an error here ----
    async def jobs(self):
        return JobList.model_validate(await self._json("GET", "/v1/jobs")).jobs

    async def _job(self, method: str, job: str, verb: str = "", **kw) -> None:
        try:
            await self._send(method, f"/v1/jobs/{quote(job, safe='')}{verb}", **kw)
        except NotFound:
            pass

    async def job_pause(self, job: str) -> None:
        await self._job("POST", job, "/pause")

    async def job_resume(self, job: str) -> None:
        await self._job("POST", job, "/resume")

    async def job_stop(self, job: str) -> None:
        await self._job("DELETE", job)

    async def job_heartbeat(self, job: str, lease_s: float,
                            stop_after_s: float | None) -> None:
        req = HeartbeatRequest(lease_s=lease_s, stop_after_s=stop_after_s)
        await self._job("POST", job, "/heartbeat", content=req.model_dump_json(),
                        headers=self._json_headers)

    # ---- stateless calls and images ----
    async def fncall(self, req: FnCallRequest) -> FnCallResult:
        return FnCallResult.model_validate((await self._post_model("/v1/fncall", req)).json())

    async def fncall_many(self, calls: list[FnCallRequest]) -> list[FnCallResult]:
        resp = await self._post_model("/v1/fncall/batch", FnCallBatch(calls=calls))
        return FnCallBatchResult.model_validate(resp.json()).results

    async def list_images(self) -> list[ImageSummary]:
        return [ImageSummary.model_validate(d) for d in await self._json("GET", "/v1/images")]

    async def remove_image(self, name: str) -> None:
        await self._send("DELETE", f"/v1/images/{quote(name, safe='/:')}")


def _checked(verb):
    """``verb`` of the client, its node's answer not trusted blindly: what does not parse
    as a node's answer (or names another node's sandbox) is the node's failure, NodeLost
    naming it, not the gateway's (a 500)."""
    @functools.wraps(verb)
    async def call(self: HttpNodeClient, *args, **kw):
        mark = _ANSWERED.set(False)
        try:
            return await verb(self, *args, **kw)
        except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
            # only what the node answered is held against it: a request this side could
            # not even build (a caller's odd input) must not get a node distrusted
            if isinstance(exc, DSecError) or not _ANSWERED.get():
                raise
            raise self._untrusted(exc) from exc
        finally:
            _ANSWERED.reset(mark)
    return call


# every verb (not the async generators, which check their events as they come)
for _name, _verb in list(vars(HttpNodeClient).items()):
    if not _name.startswith("_") and _name != "close" and inspect.iscoroutinefunction(_verb):
        setattr(HttpNodeClient, _name, _checked(_verb))


