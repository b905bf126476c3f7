"""Which EROFS layer an OCI layer tar became, so no tar is fetched or converted twice.

An OCI layer is known by two digests: of its blob as stored (often gzip or zstd) and of
the uncompressed tar (the config's ``diff_id``). Both map to the EROFS :class:`LayerRef`
built from it, in ``<store>/oci/<hex>.json``. Written by pulls and imports (tar -> EROFS)
and by exports (EROFS -> tar), so an image pushed from dsec and pulled back, or a Dockerfile
built on a dsec image, reuses the very layers it started from.
"""

from __future__ import annotations

import pathlib

from dsec.images.models import LayerRef
from dsec.images.refs import digest_hex
from dsec.images.store import LocalStore

__all__ = ["LayerMap"]


class LayerMap:
    """OCI layer digest -> EROFS LayerRef, next to the store it points into."""

    def __init__(self, store: LocalStore) -> None:
        self.store = store
        self.root = store.root / "oci"
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, digest: str) -> pathlib.Path:
        return self.root / (digest_hex(digest) + ".json")

    def get(self, digest: str) -> LayerRef | None:
        """The EROFS layer an OCI layer (blob or diff_id digest) became, if it is still
        here (a garbage-collected layer is as good as unknown)."""
        try:
            ref = LayerRef.model_validate_json(self._path(digest).read_bytes())
        except (FileNotFoundError, ValueError):
            return None
        return ref if self.store.has_blob(ref.digest) else None

    def put(self, digests: list[str | None], ref: LayerRef) -> None:
        """Record that the OCI layer known by ``digests`` is EROFS layer ``ref``."""
        data = ref.model_dump_json().encode()
        for d in dict.fromkeys(d for d in digests if d):
            self.store._write_atomic(self._path(d), data)
