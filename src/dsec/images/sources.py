"""Where a layer's bytes come from when it is mounted: local blob, lazy FUSE file, or pull.

Local blobs are verified whole before their first mount. With a remote store, a missing
layer is either exposed lazily (``lazy=True``: the FUSE file of :mod:`dsec.images.lazyfs`,
chunks verified as they arrive) or pulled whole and verified first (``lazy=False``, the
baseline the benchmarks compare against).
"""

from __future__ import annotations

import pathlib

from pydantic import BaseModel, ConfigDict, Field

from dsec.api.errors import NotFound
from dsec.images.lazyd import LazyDaemon
from dsec.images.refs import digest_hex
from dsec.images.remote import ChunkCache, open_remote
from dsec.images.store import LocalStore

__all__ = ["RemoteConfig", "LayerSources"]


class RemoteConfig(BaseModel):
    """How a node reaches a remote layer store."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(description="Base URL of a dsec server's layer store (/v1/blobs, "
                                 "/v1/manifests), or an OCI registry repository: "
                                 "'oci://host[:port]/repo' ('oci+http://' for plain HTTP "
                                 "on a loopback or private address).")
    token: str | None = Field(None, description="Bearer token, if the server wants one.")
    lazy: bool = Field(True, description="Fetch layer data on demand (else pull whole layers).")
    cache_max_bytes: int | None = Field(
        16 << 30, ge=1 << 20,
        description="Bound of the node's chunk cache; least recently used chunks are "
                    "evicted past it (None: unbounded).")


class LayerSources:
    """Answers 'which file do I mount for this layer?' (called under the store lock)."""

    def __init__(self, store: LocalStore, remote: RemoteConfig | None) -> None:
        self.store, self.config = store, remote
        self.cache = ChunkCache(store.root / "chunks", remote.cache_max_bytes if remote else None)
        self.remote = open_remote(remote.url, self.cache, remote.token) if remote else None
        self.daemon = (LazyDaemon(store.root / "lazy", self.cache.root, remote.url, remote.token,
                                  remote.cache_max_bytes)
                       if remote and remote.lazy else None)

    def source_for(self, digest: str) -> pathlib.Path:
        """The verified file to mount for layer ``digest``."""
        if self.store.has_blob(digest) or self.remote is None:
            return self.store.verify_blob(digest)
        ref = self.store.layer_ref(digest)
        if ref is None:
            raise NotFound(f"layer {digest} is in no manifest this node has fetched")
        if self.daemon is None:
            tmp = self.store.tempdir("pull-") / "blob"
            self.remote.pull(digest, tmp)
            self.store.add_blob_file(tmp)
            tmp.parent.rmdir()
            return self.store.verify_blob(digest)
        self.remote.chunk_table(digest, ref.chunks or "")  # refuse a bad table before mounting
        meta = self.cache.root / digest_hex(digest) / "meta.json"
        if not meta.exists():
            self.cache.write_atomic(meta, ref.model_dump_json().encode())
        self.daemon.ensure()
        return self.daemon.mountpoint / digest_hex(digest)

    def healthy(self, digest: str) -> bool:
        """False if ``digest`` is mounted from the lazy FUSE file and its daemon is gone."""
        if self.daemon is None or self.store.has_blob(digest):
            return True
        return self.daemon.alive()

    def fetch_manifest(self, ref: str) -> tuple[str, str | None] | None:
        """Fetch a manifest from the remote store into the local one; its digest and the
        project whose snapshot tag ``ref`` is there (None: shared), or None."""
        if self.remote is None:
            return None
        digest, data, project = self.remote.manifest(ref)
        self.store.put_manifest_bytes(data)
        return digest, project

    def stop_daemon(self) -> None:
        """Stop the lazy-loading daemon; call only once no EROFS mount sits on it."""
        if self.daemon is not None:
            self.daemon.stop()
