"""A blocking client for one dsec-agent command, for code that runs in a worker thread.

File operations (:mod:`.files`) are synchronous by protocol; they speak the same frames as
:mod:`dsec.node.agent.client` over a plain socket instead of nesting an event loop.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

from dsec.node.agent.client import HEADER, MAX_FRAME, AgentGone, SpawnRequest, refusal

__all__ = ["SyncCommand"]


class SyncCommand:
    """One command started through the agent; read its events with :meth:`next_event`."""

    def __init__(self, connect: Callable[[], socket.socket], argv: list[str],
                 env: dict[str, str] | None = None, timeout: float = 600.0,
                 unconfined: bool = False, protect: list[str] | None = None,
                 nolink: list[str] | None = None) -> None:
        try:
            self.sock = connect()
        except OSError as exc:
            raise AgentGone(f"sandbox agent unreachable: {exc}") from exc
        self.sock.settimeout(timeout)
        self.exit_code: int | None = None
        req = SpawnRequest(argv=argv, env=env or {"PATH": "/.dsec:/bin"}, unconfined=unconfined,
                           protect=list(protect or []), nolink=list(nolink or []))
        self._send(b"S", req.encode())
        kind, payload = self._recv()
        if kind == b"F":
            self.close()
            refusal(payload)
        if kind != b"P":
            self.close()
            raise AgentGone(f"unexpected agent frame {kind!r}")

    def _send(self, kind: bytes, payload: bytes = b"") -> None:
        try:
            self.sock.sendall(HEADER.pack(kind[0], 0, len(payload)) + payload)
        except OSError as exc:
            raise AgentGone(f"sandbox agent connection lost: {exc}") from exc

    def _exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            try:
                chunk = self.sock.recv(n - len(buf))
            except OSError as exc:
                raise AgentGone(f"sandbox agent connection lost: {exc}") from exc
            if not chunk:
                raise AgentGone("sandbox agent closed the connection")
            buf += chunk
        return bytes(buf)

    def _recv(self) -> tuple[bytes, bytes]:
        kind, _chan, length = HEADER.unpack(self._exact(HEADER.size))
        if length > MAX_FRAME:
            raise AgentGone(f"agent frame too large: {length}")
        return bytes([kind]), self._exact(length) if length else b""

    def write(self, data: bytes) -> None:
        """Send ``data`` to the command's stdin."""
        for i in range(0, len(data), MAX_FRAME):
            self._send(b"I", data[i:i + MAX_FRAME])

    def close_stdin(self) -> None:
        self._send(b"E")

    def next_event(self) -> tuple[str, bytes]:
        """``("stdout"|"stderr", data)`` or ``("exit", b"")`` once at the end."""
        kind, payload = self._recv()
        if kind == b"O":
            return "stdout", payload
        if kind == b"R":
            return "stderr", payload
        if kind == b"X":
            self.exit_code = int(payload.split()[0])
            self.close()
            return "exit", b""
        raise AgentGone(f"unexpected agent frame {kind!r}")

    def run(self, stdin: bytes = b"") -> tuple[int, bytes, bytes]:
        """Feed ``stdin``, wait for the exit; return (exit code, stdout, stderr)."""
        if stdin:
            self.write(stdin)
        self.close_stdin()
        out, err = bytearray(), bytearray()
        while True:
            kind, data = self.next_event()
            if kind == "exit":
                return self.exit_code or 0, bytes(out), bytes(err)
            (out if kind == "stdout" else err).extend(data)

    def close(self) -> None:
        self.sock.close()
