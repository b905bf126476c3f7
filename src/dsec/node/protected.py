"""Which file operations touch a sandbox's protected paths. Pure: no I/O.

Agent commands are kept out of protected paths by Landlock in the in-sandbox agent; the
files API is kept out by the file operations themselves (``RootedFiles`` for containers,
``AgentFiles`` for guests), which ask these functions about every path *after* the kernel
resolved it (symlinks, ``..``) inside the sandbox root. Only the grading identity (a
grader or admin token, ``grading=True`` from a gateway) gets file operations without them.

What a caller without that identity sees: a protected path, and everything under it, is
neither read, written, listed, stat'ed, created, removed nor packed; an operation on a
directory above one that would reach into it (a recursive remove, a tar download, a tar
upload) is refused as a whole rather than silently cut. A listing of a directory above a
protected path still shows its name and type, as any directory entry: its contents never.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePosixPath

from dsec.api.errors import Forbidden

__all__ = ["covering", "inside", "check_path", "check_tree"]


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def covering(protected: Sequence[str], path: str) -> str | None:
    """The protected path that ``path`` (absolute, resolved) is or lies under, if any."""
    return next((p for p in protected if _under(path, p)), None)


def inside(protected: Sequence[str], path: str) -> str | None:
    """A protected path that ``path`` is, lies under, or holds below it, if any: what a
    whole-tree operation on ``path`` (recursive remove, tar) would reach."""
    return covering(protected, path) or next(
        (p for p in protected if _under(p, path)), None)


def _refusal(asked: str, resolved: str, hit: str) -> Forbidden:
    a, r = PurePosixPath(asked), PurePosixPath(resolved)
    # a directory on the way (mkdir -p) is no detour: say "resolves to" only for one
    via = "" if a == r or r in a.parents else f" (it resolves to {resolved})"
    return Forbidden(f"{asked}{via} is protected: {hit} is one of the sandbox's "
                     "protected_paths, which only the grading identity (a grader or admin "
                     "token) reaches through the files API")


def check_path(protected: Sequence[str], asked: str, resolved: str) -> None:
    """Raise :class:`Forbidden` if ``resolved`` (what ``asked`` named) is protected."""
    hit = covering(protected, resolved)
    if hit is not None:
        raise _refusal(asked, resolved, hit)


def check_tree(protected: Sequence[str], asked: str, resolved: str) -> None:
    """Raise :class:`Forbidden` if an operation on the whole tree at ``resolved`` would
    reach a protected path."""
    hit = inside(protected, resolved)
    if hit is None:
        return
    if covering(protected, resolved) is not None:
        raise _refusal(asked, resolved, hit)
    raise Forbidden(f"{asked} holds the protected path {hit}: an operation on the whole "
                    "tree would reach it, and only the grading identity (a grader or admin "
                    "token) may; name a directory beside it instead")
