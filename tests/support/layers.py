"""Image layers made for a test: a directory tree imported into a node's layer store."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path

__all__ = ["import_linked_layer"]


async def import_linked_layer(images, root: Path, prefix: str, secret: bytes,
                              extra: dict[str, bytes] | None = None) -> str:
    """Import, into ``images`` (an :class:`~dsec.images.ImageService`), a layer whose
    /srv/h (and /srv/d/h2) is a hard link to its /grader/secret.txt (holding ``secret``),
    plus ``extra`` files (path in the layer -> content). The tree is built at ``root``;
    returns the new tag, ``{prefix}/linked-<random>:v1``."""
    (root / "grader").mkdir(parents=True)
    (root / "srv" / "d").mkdir(parents=True)
    (root / "grader" / "secret.txt").write_bytes(secret)
    (root / "srv" / "h").hardlink_to(root / "grader" / "secret.txt")
    (root / "srv" / "d" / "h2").hardlink_to(root / "grader" / "secret.txt")
    for path, data in (extra or {}).items():
        (root / path).write_bytes(data)
    tag = f"{prefix}/linked-{secrets.token_hex(4)}:v1"
    await asyncio.to_thread(images.import_rootfs, root, tag)
    return tag
