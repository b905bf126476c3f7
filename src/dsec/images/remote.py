"""Client of a remote layer store: manifests, and blob bytes in verified 256 KiB chunks.

Chunks fetched are kept in a node-local chunk cache (``<cache>/<hex>/<index>``), so a
second sandbox, or a second node process, never fetches them again. Every chunk is
checked against the blob's chunk table, itself checked against the digest the (verified)
manifest records, so a corrupted byte is never cached or handed to the kernel.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import pathlib
import shutil
import tempfile
import threading

import httpx

from dsec.api.errors import Internal, NotFound, error_from_wire
from dsec.images.refs import digest_hex
from dsec.images.store import CHUNK_SIZE, CorruptBlob, table_digest

__all__ = ["RemoteStore", "ChunkCache", "open_remote", "PROJECT_HEADER"]

PROJECT_HEADER = "Dsec-Project"  # on a manifest by tag: the project whose snapshot it is


class ChunkCache:
    """Verified chunks of remote blobs on local disk, plus the bytes-fetched counter.

    With ``max_bytes``, the chunks kept are bounded: a put that takes the total over the
    bound evicts the least recently used chunks (a hit refreshes a chunk's mtime, which is
    the LRU order, so it holds across processes and restarts) down to 90 % of it. An
    evicted chunk of a mounted layer is simply fetched again when the kernel next needs it.
    """

    def __init__(self, root: pathlib.Path, max_bytes: int | None = None) -> None:
        self.root = pathlib.Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._total: int | None = None  # bytes of chunk files, counted on first need

    def path(self, digest: str, index: int) -> pathlib.Path:
        """File of one chunk."""
        return self.root / digest_hex(digest) / str(index)

    def get(self, digest: str, index: int) -> bytes | None:
        """A cached chunk, or None."""
        path = self.path(digest, index)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        if self.max_bytes is not None:
            with contextlib.suppress(FileNotFoundError):
                os.utime(path)  # recently used: evicted last
        return data

    def put(self, digest: str, index: int, data: bytes) -> None:
        """Store a verified chunk (atomically), evicting old chunks past the bound."""
        self.write_atomic(self.path(digest, index), data)
        if self.max_bytes is None:
            return
        with self._lock:
            if self._total is None:
                self._total = sum(size for _, size, _ in self._chunk_files())
            else:
                self._total += len(data)
            if self._total > self.max_bytes:
                self._total = self._evict(int(self.max_bytes * 0.9))

    def _chunk_files(self) -> list[tuple[float, int, pathlib.Path]]:
        """(mtime, size, path) of every chunk file (tables and metadata are not chunks)."""
        out = []
        for layer in os.scandir(self.root):
            if len(layer.name) != 64 or not layer.is_dir():
                continue
            for f in os.scandir(layer.path):
                if f.name.isdigit():
                    with contextlib.suppress(FileNotFoundError):
                        st = f.stat()
                        out.append((st.st_mtime, st.st_size, pathlib.Path(f.path)))
        return out

    def _evict(self, target: int) -> int:
        """Delete least recently used chunks until at most ``target`` bytes remain."""
        files = sorted(self._chunk_files(), key=lambda t: t[0])
        total = sum(size for _, size, _ in files)
        for _, size, path in files:
            if total <= target:
                break
            path.unlink(missing_ok=True)
            total -= size
        return total

    def chunk_bytes(self) -> int:
        """Bytes of chunks cached right now."""
        return sum(size for _, size, _ in self._chunk_files())

    def table(self, digest: str) -> bytes | None:
        """The cached chunk table of a blob, or None."""
        try:
            return (self.root / digest_hex(digest) / "table").read_bytes()
        except FileNotFoundError:
            return None

    def put_table(self, digest: str, table: bytes) -> None:
        """Store a verified chunk table."""
        self.write_atomic(self.root / digest_hex(digest) / "table", table)

    def layers(self) -> set[str]:
        """Digests of the layers with anything cached."""
        return {"sha256:" + p.name for p in self.root.iterdir() if len(p.name) == 64}

    def remove(self, digest: str) -> int:
        """Drop a layer's cached chunks; returns the bytes freed."""
        d = self.root / digest_hex(digest)
        if not d.is_dir():
            return 0
        size = sum(p.stat().st_size for p in d.iterdir())
        shutil.rmtree(d, ignore_errors=True)
        return size

    def add_fetched(self, n: int) -> None:
        """Add ``n`` to the bytes-fetched counter kept in ``stats.json``."""
        with self._lock, open(self.root / ".stats.lock", "w") as lk:
            fcntl.flock(lk, fcntl.LOCK_EX)  # the lazy-loading daemon counts here too
            total = self.bytes_fetched() + n
            self.write_atomic(self.root / "stats.json", json.dumps({"bytes_fetched": total}).encode())

    def bytes_fetched(self) -> int:
        """Bytes fetched from the remote store into this cache so far."""
        try:
            return json.loads((self.root / "stats.json").read_bytes())["bytes_fetched"]
        except (FileNotFoundError, ValueError):
            return 0

    def write_atomic(self, dest: pathlib.Path, data: bytes) -> None:
        """Write ``dest`` whole or not at all."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".w-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, dest)


class RemoteStore:
    """Reads manifests and blobs served by :func:`dsec.images.http.blob_router`."""

    def __init__(self, url: str, cache: ChunkCache, token: str | None = None,
                 timeout: float = 60.0, transport: httpx.BaseTransport | None = None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self.cache = cache
        self.client = httpx.Client(base_url=self.url, headers=headers, timeout=timeout,
                                   transport=transport)

    def close(self) -> None:
        """Close the HTTP connections."""
        self.client.close()

    def _get(self, path: str, **kw) -> httpx.Response:
        return self._send("GET", path, **kw)

    def manifest(self, ref: str) -> tuple[str, bytes, str | None]:
        """(digest, JSON bytes, project) of the manifest ``ref`` names remotely, verified;
        ``project`` is the project whose snapshot tag ``ref`` is there (None: shared)."""
        r = self._get(f"/v1/manifests/{ref}")
        digest = "sha256:" + hashlib.sha256(r.content).hexdigest()
        claimed = r.headers.get("Dsec-Content-Digest", digest)
        if claimed != digest or (ref.startswith("sha256:") and ref != digest):
            raise CorruptBlob(f"manifest {ref} from {self.url} hashes to {digest}, "
                              f"not {claimed}; refusing it")
        return digest, r.content, r.headers.get(PROJECT_HEADER)

    def chunk_table(self, digest: str, expect: str) -> bytes:
        """The blob's chunk table, checked against the manifest's ``chunks`` digest."""
        table = self.cache.table(digest)
        if table is None or table_digest(table) != expect:
            table = self._fetch_table(digest, expect)
            if table_digest(table) != expect:
                raise CorruptBlob(f"chunk table of layer {digest} does not match its "
                                  f"manifest ({table_digest(table)} != {expect}); refusing it")
            self.cache.put_table(digest, table)
        return table

    def chunk(self, digest: str, index: int, table: bytes, size: int) -> bytes:
        """Chunk ``index`` of a blob of ``size`` bytes: from the cache or fetched, verified."""
        data = self.cache.get(digest, index)
        want = table[index * 32:(index + 1) * 32]
        if data is not None and hashlib.sha256(data).digest() == want:
            return data
        start = index * CHUNK_SIZE
        end = min(start + CHUNK_SIZE, size) - 1
        data = self._fetch_range(digest, start, end)
        self.cache.add_fetched(len(data))
        if hashlib.sha256(data).digest() != want:
            raise CorruptBlob(f"chunk {index} of layer {digest} is corrupted; refusing it")
        self.cache.put(digest, index, data)
        return data

    def _fetch_table(self, digest: str, expect: str) -> bytes:
        """The chunk table's bytes from the server (checked by the caller)."""
        return self._get(f"/v1/blobs/{digest}/chunks").content

    def _fetch_range(self, digest: str, start: int, end: int) -> bytes:
        """Bytes ``start..end`` (inclusive) of a blob from the server (checked by the caller)."""
        return self._get(f"/v1/blobs/{digest}", headers={"Range": f"bytes={start}-{end}"}).content

    def read(self, digest: str, offset: int, length: int, table: bytes, size: int) -> bytes:
        """``length`` bytes of a blob from ``offset`` (short at the end of the blob)."""
        end = min(offset + length, size)
        out = bytearray()
        pos = offset
        while pos < end:
            index = pos // CHUNK_SIZE
            data = self.chunk(digest, index, table, size)
            lo = pos - index * CHUNK_SIZE
            piece = data[lo:lo + (end - pos)]
            out += piece
            pos += len(piece)
        return bytes(out)

    def has_blob(self, digest: str) -> bool:
        """True if the remote store holds the blob."""
        try:
            return self.client.head(f"/v1/blobs/{digest}").status_code == 200
        except httpx.HTTPError as exc:
            raise Internal(f"remote layer store {self.url}: HEAD failed: {exc}") from exc

    def push_blob(self, digest: str, path: pathlib.Path) -> None:
        """Upload a local blob (the server checks it hashes to ``digest``)."""
        with open(path, "rb") as f:
            self._send("PUT", f"/v1/blobs/{digest}", content=iter(lambda: f.read(1 << 20), b""))

    def push_manifest(self, name: str, data: bytes) -> str:
        """Upload manifest JSON and tag it ``name`` remotely; returns its digest."""
        return self._send("PUT", f"/v1/manifests/{name}", content=data,
                          headers={"Content-Type": "application/json"}).json()["digest"]

    def _send(self, method: str, path: str, **kw) -> httpx.Response:
        try:
            r = self.client.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise Internal(f"remote layer store {self.url}: {method} {path} failed: {exc}") from exc
        if r.status_code >= 400:
            try:
                body = r.json()
            except ValueError:
                body = r.text
            raise error_from_wire(body, r.status_code)
        return r

    def pull(self, digest: str, dest: pathlib.Path) -> int:
        """Download a whole blob to ``dest`` and verify it (the full-pull path)."""
        h = hashlib.sha256()
        try:
            with self.client.stream("GET", f"/v1/blobs/{digest}") as r, open(dest, "wb") as f:
                if r.status_code >= 400:
                    raise NotFound(f"layer {digest} not found at {self.url}")
                for block in r.iter_bytes(1 << 20):
                    h.update(block)
                    f.write(block)
        except httpx.HTTPError as exc:
            raise Internal(f"remote layer store {self.url}: pulling {digest} failed: {exc}") from exc
        self.cache.add_fetched(dest.stat().st_size)
        if "sha256:" + h.hexdigest() != digest:
            dest.unlink(missing_ok=True)
            raise CorruptBlob(f"layer {digest} from {self.url} is corrupted; refusing it")
        return dest.stat().st_size



def open_remote(url: str, cache: ChunkCache, token: str | None = None) -> RemoteStore:
    """The client of the layer store at ``url``: a dsec server's ``/v1/blobs``, or an OCI
    registry for 'oci://host[:port]/repo' (HTTPS) and 'oci+http://host[:port]/repo'."""
    if url.startswith(("oci://", "oci+http://", "oci+https://")):
        from dsec.images.ocistore import RegistryStore

        return RegistryStore(url, cache)
    return RemoteStore(url, cache, token)
