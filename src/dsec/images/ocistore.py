"""An OCI registry as dsec's shared layer store: EROFS layers as artifacts, read by range.

``--images-remote oci://host[:port]/REPO`` (``oci+http://`` for plain HTTP on a loopback or
private address) keeps every dsec image in one registry repository, each as an OCI
artifact manifest::

    artifactType  application/vnd.dsec.image.v1
    config        the dsec manifest JSON, byte for byte (so its digest is the dsec
                  manifest digest, and a manifest by digest is just that blob)
    layers        per layer: the EROFS blob, then its chunk table (raw sha256 of each
                  256 KiB chunk), whose digest is the manifest's ``chunks``

tagged with the dsec name made tag-safe (plus a hash, so two names never collide). Blobs
sit in one repository, so the node's lazy loader reads any layer's chunks with plain range
requests on ``/v2/REPO/blobs/<digest>``; each chunk is checked against the table, the
table against the (verified) manifest, exactly as with a dsec server as the store.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import re
import tempfile

import httpx

from dsec.api.errors import InvalidArgument
from dsec.images.models import Manifest
from dsec.images.refs import is_digest, normalize_ref
from dsec.images.registry import RegistryAuth, RegistryClient
from dsec.images.remote import ChunkCache, RemoteStore
from dsec.images.store import CHUNK_SIZE, CorruptBlob, hash_blob

__all__ = ["RegistryStore", "artifact_tag", "parse_store_url"]

ARTIFACT = "application/vnd.dsec.image.v1"
CONFIG_TYPE = "application/vnd.dsec.manifest.v1+json"
EROFS_TYPE = "application/vnd.dsec.layer.v1.erofs"
CHUNKS_TYPE = "application/vnd.dsec.chunks.v1"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def parse_store_url(url: str) -> tuple[str, str, bool]:
    """'oci+http://127.0.0.1:5000/dsec/store' -> ('127.0.0.1:5000', 'dsec/store', True)."""
    m = re.fullmatch(r"oci(\+https?)?://([^/]+)/([a-z0-9][a-z0-9._/-]*)", url.rstrip("/"))
    if not m:
        raise InvalidArgument(f"a registry layer store is 'oci://host[:port]/repository' "
                              f"('oci+http://' for plain HTTP); got {url!r}")
    return m.group(2), m.group(3), m.group(1) == "+http"


def artifact_tag(name: str) -> str:
    """A registry tag for dsec name ``name``: readable, and unique by a hash suffix."""
    name = normalize_ref(name)
    readable = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip(".-")[:100] or "image"
    return f"{readable}-{hashlib.sha256(name.encode()).hexdigest()[:12]}"


def _table_size(size: int) -> int:
    return -(-size // CHUNK_SIZE) * 32


class RegistryStore(RemoteStore):
    """The RemoteStore interface over an OCI registry repository (see module docstring)."""

    def __init__(self, url: str, cache: ChunkCache, timeout: float = 60.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        host, self.repo, insecure = parse_store_url(url)
        self.url, self.cache = url, cache
        self.registry = RegistryClient(host, RegistryAuth(insecure=insecure), timeout=timeout,
                                       transport=transport)

    def close(self) -> None:
        """Close the connections."""
        self.registry.close()

    def _what(self, thing: str) -> str:
        return f"{thing} in layer store {self.url}"

    def manifest(self, ref: str) -> tuple[str, bytes, None]:
        """(digest, JSON bytes, None) of a dsec manifest by tag or digest, verified (a
        registry's tags are no project's own)."""
        if is_digest(ref):
            data = self.registry.blob_bytes(self.repo, ref, 4 << 20,
                                            self._what(f"manifest {ref}"))
            return ref, data, None
        what = self._what(f"image {ref}")
        _, raw, _ = self.registry.manifest(self.repo, artifact_tag(ref), what)
        doc = json.loads(raw)
        config = doc.get("config") or {}
        if doc.get("artifactType") != ARTIFACT and config.get("mediaType") != CONFIG_TYPE:
            raise InvalidArgument(f"{what} is not a dsec image (artifactType "
                                  f"{doc.get('artifactType')!r})")
        digest = config["digest"]
        return digest, self.registry.blob_bytes(self.repo, digest, 4 << 20, what), None

    def _fetch_table(self, digest: str, expect: str) -> bytes:
        return self.registry.blob_bytes(self.repo, expect, 64 << 20,
                                        self._what(f"chunk table of layer {digest}"))

    def _fetch_range(self, digest: str, start: int, end: int) -> bytes:
        what = self._what(f"layer {digest} bytes {start}-{end}")
        with self.registry.blob(self.repo, digest, what, (start, end)) as r:
            return r.read()

    def has_blob(self, digest: str) -> bool:
        """True if the repository holds the blob."""
        return self.registry.has_blob(self.repo, digest, self._what(f"layer {digest}"))

    def push_blob(self, digest: str, path: pathlib.Path) -> None:
        """Upload an EROFS blob and its chunk table."""
        actual, table = hash_blob(path)
        if actual != digest:
            raise CorruptBlob(f"layer {digest} hashes to {actual}; not pushing it")
        self.registry.push_blob(self.repo, digest, path, self._what(f"layer {digest}"))
        tdigest = "sha256:" + hashlib.sha256(table).hexdigest()
        if not self.registry.has_blob(self.repo, tdigest, self._what("chunk table")):
            with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".table-") as f:
                f.write(table)
                f.flush()
                self.registry.push_blob(self.repo, tdigest, pathlib.Path(f.name),
                                        self._what(f"chunk table of layer {digest}"))

    def push_manifest(self, name: str, data: bytes) -> str:
        """Upload a dsec manifest as an artifact tagged for ``name``; returns its digest."""
        manifest = Manifest.model_validate_json(data)
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        what = self._what(f"manifest of image {name}")
        if not self.registry.has_blob(self.repo, digest, what):
            with tempfile.NamedTemporaryFile(prefix="dsec-manifest-") as f:
                f.write(data)
                f.flush()
                self.registry.push_blob(self.repo, digest, pathlib.Path(f.name), what)
        layers = []
        for lr in manifest.layers:
            layers.append({"mediaType": EROFS_TYPE, "digest": lr.digest, "size": lr.size})
            if lr.chunks:
                layers.append({"mediaType": CHUNKS_TYPE, "digest": lr.chunks,
                               "size": _table_size(lr.size)})
        doc = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": ARTIFACT,
               "config": {"mediaType": CONFIG_TYPE, "digest": digest, "size": len(data)},
               "layers": layers, "annotations": {"dev.dsec.name": normalize_ref(name)}}
        self.registry.put_manifest(self.repo, artifact_tag(name), OCI_MANIFEST,
                                   json.dumps(doc).encode(), what)
        return digest

    def pull(self, digest: str, dest: pathlib.Path) -> int:
        """Download a whole EROFS blob to ``dest`` and verify it (the full-pull path)."""
        h, what = hashlib.sha256(), self._what(f"layer {digest}")
        with self.registry.blob(self.repo, digest, what) as r, open(dest, "wb") as f:
            for block in r.iter_bytes(1 << 20):
                h.update(block)
                f.write(block)
        self.cache.add_fetched(dest.stat().st_size)
        if "sha256:" + h.hexdigest() != digest:
            dest.unlink(missing_ok=True)
            raise CorruptBlob(f"{what} is corrupted; refusing it")
        return dest.stat().st_size
