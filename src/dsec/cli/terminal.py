"""The local end of an interactive session: raw mode that is always undone, and the size."""

from __future__ import annotations

import os
import termios
import tty

__all__ = ["RawTerminal", "terminal_size"]


class RawTerminal:
    """Put ``fd`` in raw mode for the ``with`` block and restore its exact previous
    settings afterwards, however the block ends. Not a terminal: does nothing."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.saved: list | None = None

    def __enter__(self) -> RawTerminal:
        if os.isatty(self.fd):
            self.saved = termios.tcgetattr(self.fd)
            tty.setraw(self.fd, termios.TCSANOW)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.saved is not None:
            # TCSADRAIN: let the remote's last output reach the screen in raw mode first.
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)
            self.saved = None


def terminal_size(*fds: int) -> tuple[int, int]:
    """(rows, cols) of the first of ``fds`` that is a terminal, else 24x80."""
    for fd in fds:
        try:
            size = os.get_terminal_size(fd)
        except OSError:
            continue
        if size.lines and size.columns:
            return size.lines, size.columns
    return 24, 80
