"""File operations inside a guest, run by the guest's agent with the guest's own busybox.

The node cannot see a guest's filesystem, so every operation is a short command: the
initramfs put a static busybox at ``/.dsec/busybox``, which works whatever the image holds.
Paths are resolved by the guest kernel, inside the guest: nothing here can reach the host.

With ``protected`` paths (a caller other than the grading identity) a path that names one
outright is refused before any command runs. Each command then resolves its path in the
guest first (``readlink -f``, as the guest kernel sees symlinks and ``..``) and stops with a
marker if that lands in a protected path, which becomes the same 403 as on the container
backend, before any byte is streamed. The command itself runs under the same Landlock rules
as the agent's commands, so a symlink swapped in after that resolution still leads nowhere:
the guest kernel refuses it (a read then ends mid-stream, not with a 403).

A path under /proc, /sys or /dev (but /dev/shm) is refused by name, as on the container
backend, so the API means the same everywhere; there the guest's commands would reach its
own kernel's files, which is no escape, so a symlink to them is left to the guest.
"""

from __future__ import annotations

import io
import posixpath
import shlex
import socket
import stat as st
from collections.abc import Callable, Iterator
from pathlib import PurePosixPath
from typing import BinaryIO

from dsec.api.errors import Forbidden, InvalidArgument, NotFound, shorten
from dsec.api.models import FileInfo
from dsec.node.backends.microvm.agentsync import SyncCommand
from dsec.node import protected as prot
from dsec.node.host.rooted import KERNEL_FS, SHM, file_kind, kernel_fs_refusal, normalize_path

__all__ = ["AgentFiles"]

BB = "/.dsec/busybox"
_STAT_FMT = "%f|%s|%Y|%n"
_MARK = "dsec-protected:"  # what the in-guest resolution prints when it lands in one
_LINKED = "dsec-linked:"  # ... when it lands on another name of a protected file
_REFUSED = 97


def _guard_sh(protected: tuple[str, ...]) -> str:
    """A shell function ``_g PATH follow|entry path|tree`` that exits with the marker when
    PATH (``follow``: itself resolved; ``entry``: its parent resolved, plus its last name)
    is or lies under a protected path (``tree``: or holds one below it), or is a file with
    several names and the inode of a protected file (a hard link the grading step made
    beside one: stat is not checked by Landlock, so the guarded command may look). A path
    that does not resolve yet (missing parents) passes: the command then fails, or Landlock
    stops it."""
    prots = " ".join(shlex.quote(p.rstrip("/")) for p in protected)
    return (f'_g() {{ if [ "$2" = entry ]; then '
            f'r=$({BB} readlink -f -- "$({BB} dirname -- "$1")") || return 0; '
            f'r="${{r%/}}/$({BB} basename -- "$1")"; '
            f'else r=$({BB} readlink -f -- "$1") || return 0; fi; '
            f'for p in {prots}; do case "$r/" in "$p"/*) ;; *) [ "$3" = tree ] || continue; '
            f'case "$p/" in "${{r%/}}"/*) ;; *) continue;; esac;; esac; '
            f'echo "{_MARK}$r" >&2; exit {_REFUSED}; done; '
            f'_i() {{ {BB} stat -c "%h %d:%i %F" -- "$1" 2>/dev/null; }}; t=$(_i "$r"); '
            f'case "$t" in "1 "*|*" directory"|"") return 0;; '
            f'esac; for p in {prots}; do [ "$(_i "$p")" = "$t" ] || continue; '
            f'echo "{_LINKED}$r|$p" >&2; exit {_REFUSED}; done; }}; ')


def _parse_stat(line: str, path: str | None = None) -> FileInfo:
    raw_mode, size, mtime, name = line.split("|", 3)
    mode = int(raw_mode, 16)
    p = path or name
    return FileInfo(path=p, name=PurePosixPath(p).name or "/", type=file_kind(mode),
                    size=int(size), mode=st.S_IMODE(mode), mtime=float(mtime))


def _raise(path: str, code: int, err: bytes, protected: tuple[str, ...] = ()) -> None:
    msg = err.decode(errors="replace").strip()
    if protected and code == _REFUSED and _LINKED in msg:
        resolved, hit = msg.split(_LINKED, 1)[1].splitlines()[0].split("|", 1)
        raise Forbidden(f"{path} is protected: it is a hard link to {hit}, one of the "
                        "sandbox's protected_paths, which only the grading identity (a "
                        "grader or admin token) reaches through the files API")
    if protected and code == _REFUSED and _MARK in msg:
        resolved = msg.split(_MARK, 1)[1].splitlines()[0]
        prot.check_tree(protected, path, resolved)
        raise Forbidden(f"{path} (it resolves to {resolved}) reaches the sandbox's "
                        f"protected_paths {list(protected)}, which only the grading identity "
                        "(a grader or admin token) reaches through the files API")
    if protected and ("Permission denied" in msg or "Operation not permitted" in msg):
        raise Forbidden(f"{path}: {msg}: the sandbox's protected_paths {list(protected)} "
                        "are reached only by the grading identity (a grader or admin token)")
    path, msg = shorten(path), shorten(msg, 400)  # the guest's message may quote it too
    if "No such file" in msg or "not found" in msg:
        raise NotFound(f"no such file or directory in the sandbox: {path}")
    if "No space left" in msg:
        raise InvalidArgument(f"sandbox disk is full writing {path}")
    raise InvalidArgument(f"{path}: {msg or f'failed with exit code {code}'}")


class _Reader(io.RawIOBase):
    """stdout of a guest command as a readable stream."""

    def __init__(self, cmd: SyncCommand, path: str, protected: tuple[str, ...] = ()) -> None:
        self.cmd, self.path, self.buf, self.err = cmd, path, b"", bytearray()
        self.done, self.protected = False, protected
        cmd.close_stdin()

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while not self.buf and not self.done:
            kind, data = self.cmd.next_event()
            if kind == "stdout":
                self.buf = data
            elif kind == "stderr":
                self.err += data
            else:
                self.done = True
                if self.cmd.exit_code:
                    _raise(self.path, self.cmd.exit_code, bytes(self.err), self.protected)
        n = min(len(b), len(self.buf))
        b[:n], self.buf = self.buf[:n], self.buf[n:]
        return n

    def close(self) -> None:
        if not self.closed:
            self.cmd.close()
        super().close()


class _Writer(io.RawIOBase):
    """stdin of a guest ``cat > path`` as a writable stream; errors surface at close."""

    def __init__(self, cmd: SyncCommand, path: str, protected: tuple[str, ...] = ()) -> None:
        self.cmd, self.path, self.protected = cmd, path, protected

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        self.cmd.write(bytes(b))
        return len(b)

    def close(self) -> None:
        if self.closed:
            return
        super().close()
        code, _out, err = self.cmd.run()
        if code:
            _raise(self.path, code, err, self.protected)


class AgentFiles:
    """:class:`dsec.node.files.FileOps` for a guest, through its agent."""

    def __init__(self, connect: Callable[[], socket.socket],
                 protected: tuple[str, ...] = (), nolink: tuple[str, ...] = ()) -> None:
        self.connect = connect
        self.protected = protected
        # the grading identity's: its commands (a tar upload's hard-link entries) make no
        # other name for a protected file across directories (agent/protect.h)
        self.nolink = nolink

    def _cmd(self, script: str, *args: str, guard: str = "") -> SyncCommand:
        """``script`` run with ``args`` as ``$1``...; ``guard`` (e.g. ``"follow path"``):
        first resolve ``$1`` in the guest and stop if it reaches a protected path."""
        pre = f'{_guard_sh(self.protected)}_g "$1" {guard}; ' if guard and self.protected \
            else ""
        return SyncCommand(self.connect, [BB, "sh", "-c", pre + script, "sh", *args],
                           protect=list(self.protected), nolink=list(self.nolink))

    def _run(self, path: str, script: str, *args: str, stdin: bytes = b"",
             guard: str = "") -> bytes:
        code, out, err = self._cmd(script, *args, guard=guard).run(stdin)
        if code:
            _raise(path, code, err, self.protected)
        return out

    def _check(self, path: str, tree: bool = False) -> str:
        """``path`` normalised; Forbidden if it names a protected path (``tree``: or holds
        one). What symlinks lead to, the guest's Landlock refuses."""
        path = normalize_path(path)
        folded = posixpath.normpath(path)
        if prot.covering(KERNEL_FS, folded) and not prot.covering((SHM,), folded):
            raise kernel_fs_refusal(path, folded)
        (prot.check_tree if tree else prot.check_path)(self.protected, path, folded)
        return path

    def stat(self, path: str) -> FileInfo:
        path = self._check(path)
        return self._probe(path, "entry path")

    def _probe(self, path: str, guard: str) -> FileInfo:
        """The guarded stat of ``path`` (``follow``: of what it leads to)."""
        deref = "-L " if guard.startswith("follow") else ""
        out = self._run(path, f'exec {BB} stat {deref}-c "{_STAT_FMT}" -- "$1"', path,
                        guard=guard)
        return _parse_stat(out.decode(errors="replace").rstrip("\n"), path)

    def list(self, path: str) -> list[FileInfo]:
        path = self._check(path)
        script = (f'cd -- "$1" || exit 2; for f in * .[!.]* ..?*; do '
                  f'[ -e "$f" ] || [ -L "$f" ] || continue; '
                  f'{BB} stat -c "{_STAT_FMT}" -- "$f"; done')
        out = self._run(path, script, path, guard="follow path").decode(errors="replace")
        entries = [_parse_stat(line) for line in out.splitlines() if line]
        for e in entries:
            e.path = str(PurePosixPath(path, e.name))
        return sorted(entries, key=lambda e: e.name)

    def mkdir(self, path: str, parents: bool = True) -> None:
        path = self._check(path)
        self._run(path, f'exec {BB} mkdir {"-p" if parents else ""} -- "$1"', path,
                  guard="follow path")

    def remove(self, path: str, recursive: bool = False) -> None:
        path = self._check(path, tree=recursive)
        if path == "/":
            raise InvalidArgument("refusing to remove the sandbox root")
        rm_dir = f"{BB} rm -rf" if recursive else f"{BB} rmdir"
        script = (f'if [ -d "$1" ] && [ ! -L "$1" ]; then exec {rm_dir} -- "$1"; '
                  f'elif [ -e "$1" ] || [ -L "$1" ]; then exec {BB} rm -f -- "$1"; '
                  f'else echo "$1: No such file or directory" >&2; exit 1; fi')
        self._run(path, script, path, guard=f"entry {'tree' if recursive else 'path'}")

    def open_read(self, path: str) -> BinaryIO:
        path = self._check(path)
        if self._probe(path, "follow path").type == "dir":
            raise InvalidArgument(f"{path} is a directory; use list or download a tar")
        cmd = self._cmd(f'exec {BB} cat -- "$1"', path, guard="follow path")
        return io.BufferedReader(_Reader(cmd, path, self.protected), 1 << 16)  # type: ignore[return-value]

    def open_write(self, path: str, mode: int = 0o644) -> BinaryIO:
        path = self._check(path)
        self._run(path, f'd=$({BB} dirname -- "$1"); '
                  f'[ -e "$d" ] || {{ echo "$d: No such file or directory" >&2; exit 1; }}; '
                  f'[ -d "$d" ] || {{ echo "$d is not a directory" >&2; exit 1; }}', path,
                  guard="follow path")
        script = f'{BB} cat > "$1" && {BB} chmod {mode:o} -- "$1"'
        return _Writer(self._cmd(script, path, guard="follow path"), path, self.protected)  # type: ignore[return-value]

    def tar_out(self, path: str) -> Iterator[bytes]:
        """A tar stream of ``path`` whose top entry is its base name."""
        path = self._check(path, tree=True)
        self._probe(path, "follow tree")
        p = PurePosixPath(path)
        cmd = self._cmd(f'cd -- "$1" && exec {BB} tar -cf - -- "$2"', str(p.parent),
                        p.name or ".")
        reader = _Reader(cmd, path, self.protected)

        def chunks() -> Iterator[bytes]:
            try:
                while chunk := reader.read(1 << 16):
                    yield chunk
            finally:
                reader.close()
        return chunks()

    def tar_in(self, path: str, stream: BinaryIO, max_bytes: int) -> int:
        """Unpack a tar stream under ``path`` (created if needed); returns bytes read."""
        path = self._check(path)
        if self.protected:  # its own command: the upload streams into the next one
            self._run(path, ":", path, guard="follow path")
        cmd = self._cmd(f'{BB} mkdir -p -- "$1" && cd -- "$1" && exec {BB} tar -xf -', path)
        total = 0
        try:
            while chunk := stream.read(1 << 16):
                total += len(chunk)
                if total > max_bytes:
                    raise InvalidArgument(f"upload larger than the {max_bytes} byte limit")
                cmd.write(chunk)
        except BaseException:
            cmd.close()
            raise
        code, _out, err = cmd.run()
        if code:
            _raise(path, code, err, self.protected)
        return total
