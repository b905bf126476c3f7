"""The SDK's HTTP transport: HTTP/1.1 on kept-alive connections, parsed by httptools.

httpx stays the client (URLs, headers, timeouts, errors); this replaces the transport
under it for plain ``http://`` URLs. Measured at 64 requests in flight, httpcore's pool
does O(connections²) work on every request and every response (each pass rescans every
connection, recounts the idle ones per connection and polls each idle socket), and its
h11 and anyio layers write a request's head and body in two sends: 3 to 6 ms of client CPU
per request, which capped one client process near 200 requests/s. Here a request takes an
idle connection off a stack, or waits its turn (first come, first served) for the next one
released or opened (up to ``max_connections``), goes out in one write, and its response
is parsed in C as it arrives.

An idle connection is dropped after ``keepalive_expiry`` seconds, shorter than the
server's own keep-alive timeout (uvicorn's 5 s), so a request is not sent on a connection
the server is closing. One that was closed anyway before any answer came is retried once
on a new connection when the request can be sent again unchanged and is idempotent.
``https://`` URLs go to httpx's own transport.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

import httptools
import httpx

__all__ = ["FastTransport", "Wire"]

IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
BUFFERED = 1 << 20  # response bytes held before reading from the socket pauses
WRITE_CHUNK = 1 << 16


class FastTransport(httpx.AsyncBaseTransport):
    """At most ``max_connections`` connections per origin, reused most recent first."""

    def __init__(self, max_connections: int = 256, keepalive_expiry: float = 4.0) -> None:
        self.max_connections = max_connections
        self.keepalive_expiry = keepalive_expiry
        self._pools: dict[tuple[str, int], _Pool] = {}
        self._tls: httpx.AsyncHTTPTransport | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme != "http":
            if self._tls is None:
                self._tls = httpx.AsyncHTTPTransport(limits=httpx.Limits(
                    max_connections=self.max_connections, max_keepalive_connections=64))
            return await self._tls.handle_async_request(request)
        return await self._pool(url).send(request)

    async def exchange(self, method: str, url: httpx.URL, headers: list[tuple[bytes, bytes]],
                       body: bytes, timeouts: dict) -> tuple[int, list[tuple[bytes, bytes]],
                                                           bytes]:
        """One request with a whole body and its whole answer: (status, headers, body),
        header names as the server sent them. The same pool, turns, retries and errors as
        :meth:`handle_async_request`, without building httpx's Request and Response
        around them (a gateway relays thousands a second: the two were about a tenth of
        the CPU of a relayed create)."""
        if url.scheme != "http":
            resp = await self.handle_async_request(httpx.Request(
                method, url, headers=headers, content=body, extensions={"timeout": timeouts}))
            try:
                content = await resp.aread()
                return resp.status_code, resp.headers.raw, content
            finally:
                await resp.aclose()
        return await self._pool(url).whole(Wire(method, url, headers, body, timeouts))

    def _pool(self, url: httpx.URL) -> _Pool:
        key = (url.host, url.port or 80)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = _Pool(key, self.max_connections, self.keepalive_expiry)
        return pool

    def abort(self, keep: Callable[[Any], bool] | None = None) -> None:
        """End every exchange now (a caller that knows the server hangs stops waiting for
        it): a request sent fails with ReadError and is not retried (a retry would wait on
        the same hung server), one still waiting for a connection with ConnectError (it
        was never sent). Requests sent for which ``keep(request)`` is true go on waiting."""
        for pool in self._pools.values():
            pool.abort(keep)

    async def aclose(self) -> None:
        for pool in self._pools.values():
            pool.shutdown()
        self._pools.clear()
        if self._tls is not None:
            await self._tls.aclose()


class Wire:
    """A request as it goes out: what the pool and a connection read of an
    :class:`httpx.Request` (and what an error names as its request), no more."""

    __slots__ = ("method", "url", "headers", "stream", "extensions")

    def __init__(self, method: str, url: httpx.URL, headers: list[tuple[bytes, bytes]],
                 body: bytes, timeouts: dict) -> None:
        self.method, self.url = method, url
        netloc = url.netloc
        if body or method not in IDEMPOTENT:
            headers = [*headers, (b"content-length", b"%d" % len(body))]
        self.headers = _WireHeaders([(b"host", netloc), *headers])
        self.stream = httpx.ByteStream(body)
        self.extensions = {"timeout": timeouts}


class _WireHeaders:
    __slots__ = ("raw",)

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self.raw = raw

    def get(self, name: str, default: str | None = None) -> str | None:
        key = name.lower().encode("latin-1")
        return next((v.decode("latin-1") for k, v in self.raw if k.lower() == key), default)


class _Turn:
    """A request waiting for a connection."""

    __slots__ = ("fut", "request", "timeout")

    def __init__(self, fut: asyncio.Future, request: httpx.Request,
                 timeout: float | None) -> None:
        self.fut, self.request, self.timeout = fut, request, timeout


class _Pool:
    """The connections to one origin, given out in the order requests ask.

    A request takes an idle connection when nobody is waiting; otherwise it waits its turn
    and, below the limit, a connection is opened for it. Whichever comes free first, one
    released or one just opened, goes to the request that has waited longest: a request
    must not sit waiting for its own connect (tens of ms when the server is busy) while a
    later one leaves on a connection released meanwhile, or requests reach the server in
    another order than they were sent (what a FIFO queue behind it then sees).
    """

    def __init__(self, origin: tuple[str, int], limit: int, expiry: float) -> None:
        self.origin, self.limit, self.expiry = origin, limit, expiry
        self.idle: list[_Conn] = []
        self.busy: set[_Conn] = set()
        self.open = 0        # connections open or being opened
        self.connecting = 0  # of those, being opened
        self.waiting: deque[_Turn] = deque()
        self._opening: set[asyncio.Task] = set()

    async def send(self, request: httpx.Request) -> httpx.Response:
        conn = await self._answered(request)
        return httpx.Response(status_code=conn.status, headers=conn.headers,
                              stream=_Body(self, conn, request,
                                           (request.extensions.get("timeout") or {}).get("read")),
                              extensions={"http_version": b"HTTP/1.1"})

    async def whole(self, request: Wire) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """``request`` sent and its whole answer read: (status, headers, body)."""
        conn = await self._answered(request)
        chunks = []
        try:
            if request.method != "HEAD":
                timeout = request.extensions["timeout"].get("read")
                while (chunk := await conn.next_chunk(request, timeout)) is not None:
                    chunks.append(chunk)
            status, head = conn.status, conn.headers
        finally:
            self.release(conn)  # closed instead when the body was not all read
        return status, head, b"".join(chunks)

    async def _answered(self, request) -> _Conn:
        """A connection ``request`` went out on, with the head of its answer read."""
        timeouts = request.extensions.get("timeout") or {}
        retry = request.method in IDEMPOTENT and isinstance(request.stream, httpx.ByteStream)
        while True:
            conn = await self._acquire(request, timeouts)
            conn.request = request  # what abort(keep=...) asks about
            try:
                await conn.send(request, timeouts.get("write"))
                await conn.read_head(request, timeouts.get("read"))
            except _Stale:
                self.release(conn)
                if retry:
                    retry = False
                    continue
                raise httpx.RemoteProtocolError("the server closed the connection without "
                                                "answering", request=request) from None
            except BaseException:
                self.release(conn)
                raise
            return conn

    async def _acquire(self, request: httpx.Request, timeouts: dict) -> _Conn:
        if self._next_turn(pop=False) is None:
            conn = self._take_idle()
            if conn is not None:
                return conn
        turn = _Turn(asyncio.get_running_loop().create_future(), request,
                     timeouts.get("connect"))
        self.waiting.append(turn)
        self._top_up()
        try:
            return await asyncio.wait_for(turn.fut, timeouts.get("pool"))
        except asyncio.TimeoutError:
            raise httpx.PoolTimeout(f"no free connection to {self.origin[0]} within the "
                                    "pool timeout", request=request) from None
        except BaseException:
            fut = turn.fut
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self._hand(fut.result())  # given to it as it was cancelled: to the next
            raise  # a turn given up stays in the deque, dropped when it comes up

    def _take_idle(self) -> _Conn | None:
        now = time.monotonic()
        while self.idle:
            conn = self.idle.pop()
            if not conn.closed and now - conn.idle_since < self.expiry:
                conn.reused = True
                self.busy.add(conn)
                return conn
            conn.close()
            self.open -= 1
        return None

    def _next_turn(self, pop: bool = True) -> _Turn | None:
        """The longest-waiting request still waiting (turns given up are dropped)."""
        while self.waiting:
            if not self.waiting[0].fut.done():
                return self.waiting.popleft() if pop else self.waiting[0]
            self.waiting.popleft()
        return None

    def _hand(self, conn: _Conn) -> None:
        """A free, open connection: to the longest-waiting request, else idle."""
        turn = self._next_turn()
        if turn is None:
            conn.idle_since = time.monotonic()
            self.idle.append(conn)
        else:
            self.busy.add(conn)
            turn.fut.set_result(conn)

    def _top_up(self) -> None:
        """Open connections (up to the limit) for the requests no connect is under way for
        (turns given up still count until they come up: at worst an extra idle one)."""
        while len(self.waiting) > self.connecting and self.open < self.limit:
            turn = self.waiting[-1]  # whose connect timeout and request errors name
            self.open += 1
            self.connecting += 1
            task = asyncio.get_running_loop().create_task(self._open(turn))
            self._opening.add(task)
            task.add_done_callback(self._opening.discard)

    async def _open(self, turn: _Turn) -> None:
        try:
            conn = await _Conn.connect(self.origin, turn.request, turn.timeout)
        except asyncio.CancelledError:  # the loop is ending: so are the requests
            self.connecting -= 1
            self.open -= 1
            raise
        except Exception as exc:
            self.connecting -= 1
            self.open -= 1
            first = self._next_turn()  # the longest-waiting request hears why
            if first is not None:
                if isinstance(exc, httpx.RequestError):
                    exc.request = first.request
                first.fut.set_exception(exc)
            self._top_up()  # the others still need a connection each
            return
        self.connecting -= 1
        self._hand(conn)

    def release(self, conn: _Conn) -> None:
        """To the next request (or the stack) when its exchange ended cleanly, else closed."""
        self.busy.discard(conn)
        if conn.reusable():
            conn.reset()
            conn.reused = True
            self._hand(conn)
        else:
            conn.close()
            self.open -= 1
            self._top_up()

    def close(self) -> None:
        for conn in self.idle:
            conn.close()
        self.open -= len(self.idle)
        self.idle.clear()

    def abort(self, keep: Callable[[Any], bool] | None = None) -> None:
        self.close()
        while (turn := self._next_turn()) is not None:
            turn.fut.set_exception(httpx.ConnectError(
                f"the client gave up on {self.origin[0]}:{self.origin[1]}",
                request=turn.request))
        for task in list(self._opening):  # their requests have just failed
            task.cancel()
        for conn in list(self.busy):  # each is released (and counted) by its exchange
            if keep is None or conn.request is None or not keep(conn.request):
                conn.abort()

    def shutdown(self) -> None:
        """The client closes: idle connections and connects under way end, and requests
        still waiting for a connection fail."""
        self.close()
        for task in list(self._opening):
            task.cancel()
        while (turn := self._next_turn()) is not None:
            turn.fut.set_exception(httpx.ConnectError("the client was closed",
                                                      request=turn.request))


class _Stale(Exception):
    """A reused connection ended before any byte of the answer."""


class _Conn(asyncio.Protocol):
    """One HTTP/1.1 connection carrying one exchange at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.aborted = False  # ended by the client: not stale, so never retried
        self.reused = False
        self.idle_since = 0.0
        self.request = None  # the request of the exchange under way
        self.error: Exception | None = None
        self._waiter: asyncio.Future | None = None
        self._drained: asyncio.Future | None = None
        self.reset()

    @classmethod
    async def connect(cls, origin: tuple[str, int], request: httpx.Request,
                      timeout: float | None) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(loop.create_connection(cls, *origin), timeout)
        except asyncio.TimeoutError:
            raise httpx.ConnectTimeout(f"connecting to {origin[0]}:{origin[1]} timed out",
                                       request=request) from None
        except OSError as exc:
            raise httpx.ConnectError(str(exc), request=request) from exc
        return conn

    def reset(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.head_done = self.complete = self.got_bytes = False
        self.keep_alive = True

    def reusable(self) -> bool:
        return self.complete and self.keep_alive and not self.closed and self.error is None

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        """End the exchange under way now. ``transport.abort``, not ``close``: close waits
        for unsent request bytes to drain, and a hung server never takes them."""
        if self.error is None:
            self.error = httpx.ReadError("the client gave up on the server")
        self.aborted = self.closed = True
        if self.transport is not None:
            self.transport.abort()

    # ---- one exchange ----
    async def send(self, request: httpx.Request, timeout: float | None) -> None:
        url = request.url
        target = url.raw_path
        head = bytearray(b"%s %s HTTP/1.1\r\n" % (request.method.encode(), target))
        for name, value in request.headers.raw:
            head += b"%s: %s\r\n" % (name, value)
        head += b"\r\n"
        if request.method == "HEAD":
            self.keep_alive = False  # the parser would wait for a body that never comes
        chunked = request.headers.get("transfer-encoding", "").lower() == "chunked"
        buf = head
        async for chunk in request.stream:
            if chunked and chunk:
                buf += b"%x\r\n%s\r\n" % (len(chunk), chunk)
            elif not chunked:
                buf += chunk
            if len(buf) >= WRITE_CHUNK:
                await self._write(bytes(buf), request, timeout)
                buf = bytearray()
        if chunked:
            buf += b"0\r\n\r\n"
        await self._write(bytes(buf), request, timeout)

    async def _write(self, data: bytes, request: httpx.Request, timeout: float | None) -> None:
        self._check(request)
        self.transport.write(data)
        if self._drained is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._drained), timeout)
            except asyncio.TimeoutError:
                raise httpx.WriteTimeout("sending the request timed out",
                                         request=request) from None
        self._check(request)

    async def read_head(self, request: httpx.Request, timeout: float | None) -> None:
        while not self.head_done:
            await self._wait(request, timeout)

    async def next_chunk(self, request: httpx.Request, timeout: float | None) -> bytes | None:
        """The next piece of the body; None at its end."""
        while not self.chunks:
            if self.complete:
                return None
            await self._wait(request, timeout)
        chunk = self.chunks.popleft()
        self.buffered -= len(chunk)
        if self.buffered < BUFFERED // 2 and self.transport is not None and not self.closed:
            self.transport.resume_reading()
        return chunk

    async def _wait(self, request: httpx.Request, timeout: float | None) -> None:
        self._check(request)
        loop = asyncio.get_running_loop()
        fut = self._waiter = loop.create_future()
        timer = loop.call_later(timeout, _expire, fut) if timeout is not None else None
        try:
            await fut
        except asyncio.TimeoutError:
            self.error = httpx.ReadTimeout("no answer from the server in time",
                                           request=request)
            raise self.error from None
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()
        self._check(request)

    def _check(self, request: httpx.Request) -> None:
        if self.error is not None and not self.got_bytes and self.reused \
                and not self.aborted and isinstance(self.error, httpx.ReadError):
            raise _Stale()
        if self.error is not None:
            err = self.error
            if isinstance(err, httpx.RequestError):
                err.request = request
            raise err

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # ---- asyncio.Protocol ----
    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.error = httpx.RemoteProtocolError(f"malformed answer from the server: {exc}")
            self.close()
        if self.buffered > BUFFERED and self.transport is not None:
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.complete and self.error is None:
            self.error = httpx.ReadError("the server closed the connection"
                                         + (f": {exc}" if exc else ""))
        for fut in (self._waiter, self._drained):
            if fut is not None and not fut.done():
                fut.set_result(None)

    def pause_writing(self) -> None:
        self._drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        self._drained = None

    # ---- httptools callbacks ----
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.keep_alive = self.keep_alive and self.parser.should_keep_alive()
        self.head_done = True

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)

    def on_message_complete(self) -> None:
        self.complete = True


def _expire(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_exception(asyncio.TimeoutError())


class _Body(httpx.AsyncByteStream):
    """A response body read off its connection; the connection goes back on close."""

    def __init__(self, pool: _Pool, conn: _Conn, request: httpx.Request,
                 timeout: float | None) -> None:
        self._pool, self._conn, self._request, self._timeout = pool, conn, request, timeout
        self._open = True

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn = self._conn
        if self._request.method == "HEAD":
            return
        while (chunk := await conn.next_chunk(self._request, self._timeout)) is not None:
            yield chunk

    async def aclose(self) -> None:
        if self._open:
            self._open = False
            self._pool.release(self._conn)  # closed instead when the body was not all read
