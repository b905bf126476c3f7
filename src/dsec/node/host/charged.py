"""File writes charged to a sandbox's memory cgroup, by a helper process that sits in it.

A container's writable layer is a tmpfs, and a tmpfs page is charged to the memory cgroup of
the process that first writes it. Written by the node itself (the files API), the pages
would count against the node: a ``memory_mb=64`` sandbox could be handed gigabytes and
report 0.6 MiB used. So a write goes through a helper: the host's ``cat``, spawned with the
target (opened by the node inside the root, see :mod:`rooted`) as its stdout and a pipe as
its stdin, and moved into the sandbox's memory cgroup before the first byte is sent. The
node's writing thread cannot be charged on its own: memory follows the process (on v1 the
owner of the address space, and v2 has no per-thread memory cgroups), and moving the server
would charge to the sandbox whatever the server allocates meanwhile.

``cat`` opens nothing, so it reaches nothing the node did not open for it. Past the memory
limit the cgroup's OOM killer runs; the helper's ``oom_score_adj`` of 1000 makes it the
victim rather than a process of the sandbox. Out of memory or out of disk, the file is left
empty (so the sandbox has its memory back) and the write is refused naming the limit.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
from dataclasses import dataclass

from dsec.api.errors import Internal, InvalidArgument
from dsec.node.host.cgroups import CgroupDriver

__all__ = ["Charge", "ChargedWriter"]

CAT = shutil.which("cat") or "/bin/cat"


@dataclass(frozen=True)
class Charge:
    """The cgroup a sandbox's file writes are charged to, and its limits for messages."""

    cgroups: CgroupDriver
    rel: str
    memory_mb: int
    disk_mb: int


class ChargedWriter(io.RawIOBase):
    """A writable file whose bytes are written by a helper in the sandbox's cgroup.

    The helper starts at the first byte (an empty file needs none). Errors surface from
    :meth:`write` once the helper is gone, or from :meth:`close`."""

    def __init__(self, fd: int, charge: Charge, path: str) -> None:
        super().__init__()
        self.fd, self.charge, self.path = fd, charge, path
        self.pid = 0
        self._pipe = self._err = -1

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fd

    def write(self, b) -> int:
        view = memoryview(b).cast("B")
        if not view:
            return 0
        if not self.pid:
            self._start()
        try:
            while view:
                view = view[os.write(self._pipe, view):]
        except BrokenPipeError:
            self._finish()  # raises what ended the helper
            raise Internal(f"the writer of {self.path} went away") from None
        return len(b)

    def close(self) -> None:
        if self.closed:
            return
        try:
            if self.pid:
                self._finish()
        finally:
            os.close(self.fd)
            super().close()

    def _start(self) -> None:
        rd, wr = os.pipe2(os.O_CLOEXEC)
        erd, ewr = os.pipe2(os.O_CLOEXEC)
        try:
            self.pid = os.posix_spawn(CAT, [CAT], {}, file_actions=[
                (os.POSIX_SPAWN_DUP2, rd, 0), (os.POSIX_SPAWN_DUP2, self.fd, 1),
                (os.POSIX_SPAWN_DUP2, ewr, 2)])
        finally:
            os.close(rd)
            os.close(ewr)
        self._pipe, self._err = wr, erd
        try:
            with open(f"/proc/{self.pid}/oom_score_adj", "w") as f:
                f.write("1000")
            self.charge.cgroups.join_memory(self.charge.rel, self.pid)
        except OSError as exc:
            os.kill(self.pid, signal.SIGKILL)
            self._finish(check=False)
            raise Internal(f"could not charge the write of {self.path} to its sandbox "
                           f"({self.charge.rel}): {exc}") from exc

    def _finish(self, check: bool = True) -> None:
        """Close the helper's stdin, reap it and raise what went wrong, if anything."""
        if self._pipe >= 0:
            os.close(self._pipe)
            self._pipe = -1
        _, status = os.waitpid(self.pid, 0)
        self.pid = 0
        with os.fdopen(self._err, "rb") as f:
            err = f.read(4096).decode(errors="replace").strip()
        self._err = -1
        if os.waitstatus_to_exitcode(status) == 0 or not check:
            return
        os.ftruncate(self.fd, 0)  # a partial file would keep the sandbox at its limit
        raise self._error(status, err)

    def _error(self, status: int, err: str) -> InvalidArgument:
        c = self.charge
        if (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL) \
                or "Cannot allocate memory" in err:
            return InvalidArgument(
                f"writing {self.path} would take the sandbox past its memory limit "
                f"(memory_mb={c.memory_mb}; the files of its writable layer are memory): the "
                f"file was left empty; write less, remove files, or create the sandbox with "
                f"a larger memory_mb")
        if "No space left" in err:
            return InvalidArgument(
                f"sandbox disk is full writing {self.path} (disk_mb={c.disk_mb}): the file "
                f"was left empty; remove files or create the sandbox with a larger disk_mb")
        return InvalidArgument(f"{self.path}: {err or f'writer exit status {status}'}")
