"""A child process on a fresh pseudo-terminal, driven like a person at a keyboard."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import struct
import termios
import time

__all__ = ["Terminal"]


class Terminal:
    """``Terminal(argv, env)`` forks ``argv`` onto a new pty; read, type, resize, wait."""

    def __init__(self, argv: list[str], env: dict[str, str], rows: int = 24,
                 cols: int = 80) -> None:
        pid, fd = pty.fork()
        if pid == 0:  # the child: its stdin/stdout/stderr are the pty's slave side
            try:
                os.execvpe(argv[0], argv, env)
            finally:
                os._exit(127)
        self.pid, self.fd = pid, fd
        self.buf = b""
        self.resize(rows, cols)

    def resize(self, rows: int, cols: int) -> None:
        """Set the window size, as a terminal emulator does (the kernel sends SIGWINCH)."""
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def lflag(self) -> int:
        """The local modes of the slave side (ICANON, ECHO...), read through the master."""
        return termios.tcgetattr(self.fd)[3]

    def type(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def _fill(self, wait: float) -> bool:
        """Read what is there within ``wait`` seconds; False at end of output."""
        ready, _, _ = select.select([self.fd], [], [], wait)
        if not ready:
            return True
        try:
            data = os.read(self.fd, 65536)
        except OSError:  # EIO: every slave fd is closed
            return False
        self.buf += data
        return bool(data)

    def read_until(self, token: bytes, since: int = 0, timeout: float = 60) -> int:
        """Wait for ``token`` in the output after offset ``since``; returns the offset after it.

        ``timeout`` only guards against a hang; it is no performance bound."""
        deadline = time.monotonic() + timeout
        while (i := self.buf.find(token, since)) < 0:
            if time.monotonic() > deadline or not self._fill(0.2):
                raise AssertionError(f"{token!r} never came; output so far: {self.buf!r}")
        return i + len(token)

    def line_after(self, prefix: bytes, timeout: float = 60) -> bytes:
        """The rest of the line that starts with ``prefix``."""
        start = self.read_until(prefix, timeout=timeout)
        end = self.read_until(b"\r\n", since=start, timeout=timeout)
        return self.buf[start:end - 2]

    def wait(self, timeout: float = 60) -> int:
        """Read to the end, then reap the child; returns its exit status."""
        deadline = time.monotonic() + timeout
        while self._fill(0.2):
            if time.monotonic() > deadline:
                raise AssertionError(f"the child did not finish; output: {self.buf!r}")
        _, status = os.waitpid(self.pid, 0)
        self.pid = 0
        return os.waitstatus_to_exitcode(status)

    def close(self) -> None:
        if self.pid:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            self.pid = 0
        os.close(self.fd)
