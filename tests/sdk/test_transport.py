"""The SDK's HTTP transport against small HTTP/1.1 servers on loopback that misbehave on cue."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import pytest

from dsec.sdk.transport import FastTransport


class Server:
    """HTTP/1.1 on a loopback port. ``answer(n, request)`` is the n-th request of its
    connection (from 0); it returns the response bytes, or None to close unanswered."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.connections = 0
        self.requests: list[bytes] = []

    async def __aenter__(self) -> Server:
        self._srv = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._srv.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc) -> None:
        self._srv.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.connections += 1
        n = 0
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                body = b""
                lines = head.lower().split(b"\r\n")
                length = next((int(ln.split(b":")[1]) for ln in lines
                               if ln.startswith(b"content-length:")), 0)
                if length:
                    body = await reader.readexactly(length)
                elif b"transfer-encoding: chunked" in lines:
                    while size := int((await reader.readuntil(b"\r\n"))[:-2], 16):
                        body += (await reader.readexactly(size + 2))[:-2]
                    await reader.readuntil(b"\r\n")
                self.requests.append(head + body)
                out = await self.answer(n, head + body)
                n += 1
                if out is None:
                    break
                writer.write(out)
                await writer.drain()
        writer.close()


def ok(body: bytes = b"ok", extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n%s\r\n%s" % (len(body), extra, body)


async def echo(n, req):
    return ok(req.split(b"\r\n\r\n", 1)[1] or b"empty")


async def test_a_sequential_caller_keeps_one_connection():
    async with Server(echo) as srv, httpx.AsyncClient(transport=FastTransport()) as c:
        for i in range(20):
            r = await c.post(srv.url + "/x", content=b"n%d" % i)
            assert (r.status_code, r.content) == (200, b"n%d" % i)
        assert srv.connections == 1


async def test_requests_past_the_connection_limit_wait_their_turn():
    async def slow(n, req):
        await asyncio.sleep(0.01)
        return await echo(n, req)

    async with Server(slow) as srv, \
            httpx.AsyncClient(transport=FastTransport(max_connections=4)) as c:
        rs = await asyncio.gather(*(c.post(srv.url, content=b"%d" % i) for i in range(40)))
        assert [r.content for r in rs] == [b"%d" % i for i in range(40)]
        assert srv.connections == 4


async def test_a_reused_connection_closed_unanswered_retries_only_idempotent_requests():
    async def second_unanswered(n, req):
        return None if n == 1 else await echo(n, req)

    async with Server(second_unanswered) as srv, \
            httpx.AsyncClient(transport=FastTransport()) as c:
        assert (await c.get(srv.url)).content == b"empty"
        assert (await c.get(srv.url)).content == b"empty"  # retried on a new connection
        assert srv.connections == 2
        with pytest.raises(httpx.RemoteProtocolError):
            await c.post(srv.url, content=b"a")  # may have run: never sent twice
        assert sum(r.endswith(b"\r\n\r\na") for r in srv.requests) == 1


async def test_an_idle_connection_past_its_expiry_is_not_reused():
    async with Server(echo) as srv, \
            httpx.AsyncClient(transport=FastTransport(keepalive_expiry=0.05)) as c:
        await c.get(srv.url)
        await asyncio.sleep(0.1)
        await c.get(srv.url)
        assert srv.connections == 2


async def test_streamed_upload_and_download_and_a_connection_close_answer():
    async def big(n, req):
        body = req.split(b"\r\n\r\n", 1)[1]
        return ok(body * 64, b"connection: close\r\n")

    async def chunks():
        for i in range(100):
            yield b"%04d" % i

    async with Server(big) as srv, httpx.AsyncClient(transport=FastTransport()) as c:
        async with c.stream("PUT", srv.url, content=chunks()) as r:
            got = b"".join([part async for part in r.aiter_bytes()])
        assert got == b"".join(b"%04d" % i for i in range(100)) * 64
        await c.get(srv.url)
        assert srv.connections == 2  # the server said close: not reused


async def test_no_answer_in_time_is_a_read_timeout_and_no_server_a_connect_error():
    async def never(n, req):
        await asyncio.sleep(10)

    async with Server(never) as srv, httpx.AsyncClient(transport=FastTransport()) as c:
        with pytest.raises(httpx.ReadTimeout):
            await c.get(srv.url, timeout=0.2)
    async with httpx.AsyncClient(transport=FastTransport()) as c:
        with pytest.raises(httpx.ConnectError):
            await c.get(srv.url)


async def test_a_request_waiting_on_its_connect_gets_a_connection_released_meanwhile(
        monkeypatch):
    """R1 finds no idle connection and opens one, which is slow (under load a connect
    takes tens of ms); A's connection comes free meanwhile, then R2 arrives. R1 must go
    first on it: before, R2 took it from the idle stack and reached the server first."""
    from dsec.sdk import transport
    connect = transport._Conn.connect.__func__
    gate = asyncio.Event()
    connects = []

    async def slow_connect(cls, origin, request, timeout):
        connects.append(request.content)
        if len(connects) > 1:
            await gate.wait()  # every connect after the first hangs until the test says
        return await connect(cls, origin, request, timeout)

    monkeypatch.setattr(transport._Conn, "connect", classmethod(slow_connect))
    a_answer = asyncio.Event()

    async def answer(n, req):
        if req.endswith(b"A"):
            await a_answer.wait()
        return await echo(n, req)

    async with Server(answer) as srv, httpx.AsyncClient(transport=FastTransport()) as c:
        a = asyncio.create_task(c.post(srv.url, content=b"A"))
        await _until(lambda: len(srv.requests) == 1)
        r1 = asyncio.create_task(c.post(srv.url, content=b"R1"))
        await _until(lambda: len(connects) == 2)  # R1's connect is under way
        a_answer.set()
        assert (await a).content == b"A"  # A's connection is free now
        r2 = asyncio.create_task(c.post(srv.url, content=b"R2"))
        await _until(lambda: len(srv.requests) >= 2)
        gate.set()
        assert [(await r).content for r in (r1, r2)] == [b"R1", b"R2"]
        assert [q.rsplit(b"\r\n\r\n", 1)[1] for q in srv.requests] == [b"A", b"R1", b"R2"]


async def test_closing_the_client_fails_a_request_still_waiting_for_a_connection():
    answer_a = asyncio.Event()

    async def held(n, req):
        await answer_a.wait()
        return await echo(n, req)

    async with Server(held) as srv:
        t = FastTransport(max_connections=1)
        c = httpx.AsyncClient(transport=t)
        a = asyncio.create_task(c.post(srv.url, content=b"A"))
        await _until(lambda: len(srv.requests) == 1)
        b = asyncio.create_task(c.post(srv.url, content=b"B"))  # waits: the limit is 1
        await _until(lambda: any(pool.waiting for pool in t._pools.values()))
        await c.aclose()
        with pytest.raises(httpx.ConnectError, match="client was closed"):
            await asyncio.wait_for(b, 30)
        answer_a.set()
        await asyncio.gather(a, return_exceptions=True)


async def _until(cond, timeout_s: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not cond():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.005)


# ---- exchange: a whole request and its whole answer, without httpx's models ----
TIMEOUTS = httpx.Timeout(5.0).as_dict()


async def _whole(t: FastTransport, *args) -> tuple[int, bytes]:
    """``t.exchange(*args)`` without the answer's headers."""
    status, _, body = await t.exchange(*args)
    return status, body


async def test_exchange_sends_what_httpx_would_and_shares_the_pool():
    async with Server(echo) as srv:
        t = FastTransport()
        url = httpx.URL(srv.url + "/v1/x?y=1")
        headers = [(b"authorization", b"Bearer t"), (b"content-type", b"application/json")]
        assert await _whole(t, "POST", url, headers, b'{"a":1}', TIMEOUTS) == (200, b'{"a":1}')
        assert await _whole(t, "GET", url, headers[:1], b"", TIMEOUTS) == (200, b"empty")
        # a POST with no body still says so; a GET without one sends no length
        assert await _whole(t, "POST", url, headers[:1], b"", TIMEOUTS) == (200, b"empty")
        status, head, _ = await t.exchange("GET", url, [], b"", TIMEOUTS)
        assert status == 200 and (b"content-length", b"5") in head  # the answer's own
        async with httpx.AsyncClient(transport=t) as c:  # the same kept-alive connection
            assert (await c.get(str(url))).content == b"empty"
        post, get, empty_post, _, _ = srv.requests
        host = url.netloc
        assert post.startswith(b"POST /v1/x?y=1 HTTP/1.1\r\nhost: " + host + b"\r\n")
        assert b"content-length: 7\r\n" in post and b"authorization: Bearer t\r\n" in post
        assert b"content-length" not in get.lower()
        assert b"content-length: 0\r\n" in empty_post
        assert srv.connections == 1


async def test_exchange_keeps_the_pools_promises_on_stale_connections_and_errors():
    async def second_unanswered(n, req):
        if n == 1:
            return None
        if b"/fail" in req.split(b"\r\n", 1)[0]:
            return b"HTTP/1.1 404 Not Found\r\ncontent-length: 4\r\n\r\nnope"
        return await echo(n, req)

    async with Server(second_unanswered) as srv:
        t = FastTransport()
        url = httpx.URL(srv.url)
        assert await _whole(t, "GET", url, [], b"", TIMEOUTS) == (200, b"empty")
        # the server closed the kept-alive connection unanswered: a GET goes again...
        assert await _whole(t, "GET", url, [], b"", TIMEOUTS) == (200, b"empty")
        assert srv.connections == 2
        # ...a POST never goes twice
        assert await _whole(t, "GET", url, [], b"", TIMEOUTS) == (200, b"empty")
        with pytest.raises(httpx.RemoteProtocolError):
            await t.exchange("POST", url, [], b"a", TIMEOUTS)
        assert sum(r.endswith(b"\r\n\r\na") for r in srv.requests) == 1
        # an error status is an answer like any other, with its body
        assert await _whole(t, "GET", httpx.URL(srv.url + "/fail"), [], b"",
                                TIMEOUTS) == (404, b"nope")
        await t.aclose()
    with pytest.raises(httpx.ConnectError):
        await FastTransport().exchange("GET", url, [], b"", TIMEOUTS)  # nobody listens
