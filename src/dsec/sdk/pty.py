"""An interactive terminal in a sandbox, as the asynchronous SDK sees it: ``sb.pty()``.

The gateway's pty WebSocket (the one ``dsec shell`` uses): binary frames carry terminal
bytes both ways, the client sends text ``{"resize": [rows, cols]}``, and the server ends
with text ``{"exit": code}`` (or an error body when the terminal could not start).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from dsec.api.errors import (Internal, SandboxStopped, SandboxTimeout, Unauthorized,
                             Unavailable, error_from_wire)
from dsec.sdk.boundary import guarded

__all__ = ["AsyncPty", "open_pty", "ws_url"]


def ws_url(url: str, sandbox_id: str, rows: int, cols: int) -> str:
    """The pty WebSocket URL of a sandbox on the gateway at ``url``."""
    base = "wss://" + url[8:] if url.startswith("https://") else "ws://" + url.split("://", 1)[-1]
    return f"{base}/v1/sandboxes/{sandbox_id}/pty?rows={rows}&cols={cols}"


async def open_pty(url: str, token: str | None, sandbox_id: str, rows: int, cols: int) -> Any:
    """The open WebSocket of a new terminal; failures to connect as :class:`DSecError`."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus, WebSocketException

    headers = {"authorization": f"Bearer {token}"} if token else {}
    try:
        return await connect(ws_url(url, sandbox_id, rows, cols), additional_headers=headers,
                             max_size=None, open_timeout=30)
    except InvalidStatus as exc:
        code = exc.response.status_code
        if code in (401, 403):
            raise Unauthorized("missing or wrong bearer token") from exc
        raise Internal(f"terminal connection refused: HTTP {code}") from exc
    except (WebSocketException, EOFError) as exc:
        raise Unavailable(f"the server at {url} did not open a terminal as dsec does "
                          f"({exc}); is DSEC_URL the address of a dsec server?") from exc
    except (OSError, asyncio.TimeoutError) as exc:
        raise Unavailable(f"cannot reach the dsec server at {url} ({exc!r}); is it running? "
                          "(make run, or set DSEC_URL)") from exc


@guarded
class AsyncPty:
    """A shell on a pseudo-terminal: :meth:`write` keys, :meth:`read` the screen's bytes,
    :meth:`resize` it; ``exit_code`` is set once the shell exited."""

    sandbox_id: str
    exit_code: int | None

    def __init__(self, ws: Any, sandbox_id: str) -> None:
        self._ws = ws
        self.sandbox_id = sandbox_id
        self.exit_code = None

    def __repr__(self) -> str:
        state = "running" if self.exit_code is None else f"exited {self.exit_code}"
        return f"<Pty in {self.sandbox_id} {state}>"

    async def write(self, data: bytes | str) -> None:
        """Send keys (``"ls\\n"``; ``b"\\x03"`` is Ctrl-C)."""
        await self._send(data.encode() if isinstance(data, str) else data)

    async def resize(self, rows: int, cols: int) -> None:
        """Change the terminal's size (the shell gets SIGWINCH)."""
        await self._send(json.dumps({"resize": [rows, cols]}))

    async def read(self, timeout: float | None = None) -> bytes:
        """The next output bytes; ``b""`` once the shell has exited (see ``exit_code``).
        Nothing within ``timeout`` seconds raises :class:`SandboxTimeout`."""
        from websockets.exceptions import ConnectionClosed

        while self.exit_code is None:
            try:
                message = await asyncio.wait_for(self._ws.recv(), timeout)
            except asyncio.TimeoutError:
                raise SandboxTimeout(f"no terminal output from {self.sandbox_id} within "
                                     f"{timeout:g}s") from None
            except ConnectionClosed as exc:
                raise SandboxStopped(f"the terminal connection to {self.sandbox_id} closed "
                                     "before the shell exited (was the sandbox stopped?)") \
                    from exc
            if isinstance(message, bytes):
                return message
            ctl = json.loads(message)
            if not isinstance(ctl, dict):
                raise Internal(f"the terminal of {self.sandbox_id} sent a control frame that "
                               f"is not an object: {message[:80]!r}")
            if "error" in ctl:
                raise error_from_wire(ctl, 500)
            if "exit" in ctl:
                self.exit_code = ctl["exit"] if isinstance(ctl["exit"], int) else -1
                await self._ws.close()
        return b""

    async def output(self) -> AsyncIterator[bytes]:
        """Every output chunk until the shell exits."""
        while chunk := await self.read():
            yield chunk

    async def wait(self, timeout: float | None = None) -> int:
        """Read (and drop) output until the shell exits; its exit code."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while self.exit_code is None:
            await self.read(None if deadline is None else max(0.0, deadline - loop.time()))
        return self.exit_code

    async def kill(self) -> None:
        """End the terminal: the gateway kills its shell when the connection closes."""
        await self._ws.close()

    async def _send(self, message: bytes | str) -> None:
        from websockets.exceptions import ConnectionClosed
        try:
            await self._ws.send(message)
        except ConnectionClosed as exc:
            raise SandboxStopped(f"the terminal in {self.sandbox_id} has ended") from exc
