"""File operations on a sandbox, confined to its root.

The protocol is synchronous (the node runs it in a worker thread) and streams: reads and
writes hand out file objects, tar goes chunk by chunk, so files of hundreds of MB never sit
in memory.

``protected``: the sandbox paths these operations refuse (Forbidden), empty for the grading
identity; the node sets it (:meth:`dsec.node.service.NodeService.files`), and each
implementation checks the paths its kernel resolved (:mod:`dsec.node.protected`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO, Protocol

from dsec.api.models import FileInfo

__all__ = ["FileOps"]


class FileOps(Protocol):
    protected: tuple[str, ...]

    def stat(self, path: str) -> FileInfo: ...

    def list(self, path: str) -> list[FileInfo]: ...

    def mkdir(self, path: str, parents: bool = True) -> None: ...

    def remove(self, path: str, recursive: bool = False) -> None: ...

    def open_read(self, path: str) -> BinaryIO: ...

    def open_write(self, path: str, mode: int = 0o644) -> BinaryIO: ...

    def tar_out(self, path: str) -> Iterator[bytes]: ...

    def tar_in(self, path: str, stream: BinaryIO, max_bytes: int) -> int: ...
