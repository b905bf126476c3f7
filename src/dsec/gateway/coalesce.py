"""uvicorn's HTTP/1.1 protocol with each response's writes joined into one send.

uvicorn (httptools) writes a response's head as soon as the app sends
``http.response.start`` and the body on ``http.response.body``: two ``send()`` calls, and
the peer wakes up twice, reads twice and parses twice. On loopback each send also runs
the peer's TCP receive path in the sender's context. py-spy on a gateway under single
creates put about a fifth of its samples there (its own answer and the node's).
:class:`CoalescingProtocol` gives uvicorn a transport whose writes wait in memory until
the event loop's next turn (``call_soon``: no timer, no added wait), so a head and a
body written in one turn of the app leave as one send. A streamed response that awaits
between chunks still sends each chunk in its own turn, and a large write is sent at once.

It also answers a request that is not HTTP/1.1 as every other refusal is answered: a
400 with dsec's error body naming what the parser refused (uvicorn's own is a plain-text
"Invalid HTTP request received.", which names nothing and has no error code).

Use: ``uvicorn.Config(app, http=CoalescingProtocol, ...)``.
"""

from __future__ import annotations

import asyncio
import json
import sys

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from dsec.api.errors import InvalidArgument

__all__ = ["CoalescingProtocol", "CoalescingTransport"]

FLUSH_AT = 1 << 16  # bytes waiting that are sent at once (no large body held in memory)


class CoalescingTransport:
    """A transport whose writes of one loop turn leave together; all else is the wrapped
    transport's own."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []
        self._size = 0

    def write(self, data: bytes) -> None:
        if not data:
            return
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(data)
        self._size += len(data)
        if self._size >= FLUSH_AT:
            self.flush()

    def writelines(self, chunks) -> None:
        for chunk in chunks:
            self.write(chunk)

    def flush(self) -> None:
        """Send what waits now (a no-op when nothing does)."""
        if self._pending:
            data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
            self._pending, self._size = [], 0
            if not self._transport.is_closing():
                self._transport.write(data)

    def get_write_buffer_size(self) -> int:
        return self._size + self._transport.get_write_buffer_size()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()  # what was written goes out before the FIN, as it would have
        self._transport.close()

    def abort(self) -> None:
        self._pending, self._size = [], 0
        self._transport.abort()

    def __getattr__(self, name: str):
        return getattr(self._transport, name)


class CoalescingProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol over a :class:`CoalescingTransport`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CoalescingTransport(transport, self.loop))

    def send_400_response(self, msg: str) -> None:
        # uvicorn calls this inside its ``except httptools.HttpParserError``: the error it
        # handles is the parser's reason (a bad header value, chunk size, method, ...)
        exc = sys.exc_info()[1]
        why = str(exc) if exc is not None and str(exc) else "the request could not be parsed"
        body = json.dumps(InvalidArgument(
            f"not a valid HTTP/1.1 request ({why}): check the request line, the headers "
            "(names, values, Content-Length, Transfer-Encoding) and a chunked body's "
            "framing").to_wire()).encode()
        head = [STATUS_LINE[400]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [b"content-type: application/json\r\n",
                 b"content-length: %d\r\n" % len(body), b"connection: close\r\n\r\n"]
        self.transport.write(b"".join(head) + body)
        self.transport.close()
