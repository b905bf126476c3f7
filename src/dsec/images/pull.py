"""``dsec image pull``: an image from an OCI distribution registry into the layer store.

The manifest (picked for linux/amd64 from a manifest list) and the config are verified
against their digests; each layer blob is downloaded into the store's ``tmp/``, checked
for its declared size and digest, then decompressed (gzip, zstd or plain), checked against
the config's ``diff_id`` while it is extracted through :mod:`dsec.images.tarsafe`, and
built into an EROFS layer. A layer this store already converted (same blob or diff_id,
see :mod:`dsec.images.layermap`) is not fetched again. The tag is written last, so a pull
that fails leaves no tag, no manifest and no partial file (complete layers converted
before the failure stay, unreferenced, for a retry or ``gc``).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import pathlib
import shutil
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING

import httpx

from dsec.api.errors import DSecError, InvalidArgument, Unavailable
from dsec.images.layermap import LayerMap
from dsec.images.models import ImageInfo, LayerRef
from dsec.images.oci import _config
from dsec.images.refs import check_digest, layer_id, normalize_ref, parse_registry_ref
from dsec.images.registry import INDEX_TYPES, RegistryAuth, RegistryClient

if TYPE_CHECKING:
    from dsec.images.service import ImageService

__all__ = ["pull_image", "LayerDesc", "select_platform", "parse_manifest", "Progress"]

LAYER_TYPES = {
    "application/vnd.oci.image.layer.v1.tar": "tar",
    "application/vnd.oci.image.layer.v1.tar+gzip": "gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd": "zstd",
    "application/vnd.docker.image.rootfs.diff.tar.gzip": "gzip",
    "application/vnd.docker.image.rootfs.diff.tar": "tar",
}
MAX_CONFIG = 8 << 20
PARALLEL = 3  # layers fetched at once (skopeo and podman use 6; this machine has 2 cores)

Progress = Callable[[str, str, int, int], None]
"""progress(layer id, state, bytes done, bytes total); state: 'fetch', 'convert', 'present',
'done'."""


@dataclass(frozen=True)
class LayerDesc:
    """One layer as the registry's manifest describes it."""

    digest: str
    size: int
    compression: str
    diff_id: str | None


def select_platform(index: dict, what: str, os_: str = "linux", arch: str = "amd64") -> str:
    """The manifest digest of an index's entry for ``os_/arch``."""
    entries = index.get("manifests") or []
    for m in entries:
        plat = m.get("platform") or {}
        if plat.get("os") == os_ and plat.get("architecture") == arch:
            return check_digest(m["digest"])
    have = sorted({f"{(m.get('platform') or {}).get('os')}/"
                   f"{(m.get('platform') or {}).get('architecture')}" for m in entries})
    raise InvalidArgument(f"{what} has no {os_}/{arch} image; it has: "
                          f"{', '.join(have) or 'nothing'}")


def parse_manifest(doc: dict, what: str) -> tuple[dict, list[dict]]:
    """(config descriptor, layer descriptors) of an OCI or Docker schema 2 manifest."""
    if doc.get("schemaVersion") != 2:
        raise InvalidArgument(f"{what} is a schema {doc.get('schemaVersion')} manifest; only "
                              f"schema 2 (OCI or Docker) images can be pulled")
    config, layers = doc.get("config"), doc.get("layers")
    if not isinstance(config, dict) or not isinstance(layers, list):
        raise InvalidArgument(f"{what} lists no config or no layers")
    return config, layers


def _layer_descs(layers: list[dict], diff_ids: list[str], what: str,
                 max_bytes: int) -> list[LayerDesc]:
    if len(diff_ids) != len(layers):
        raise InvalidArgument(f"{what}: the manifest lists {len(layers)} layers, the config "
                              f"{len(diff_ids)} diff_ids")
    out = []
    for d, diff_id in zip(layers, diff_ids):
        digest = check_digest(str(d.get("digest")))
        kind = LAYER_TYPES.get(d.get("mediaType"))
        if kind is None:
            raise InvalidArgument(f"{what} layer {digest}: media type {d.get('mediaType')!r} "
                                  f"is not a layer tar dsec can import")
        size = d.get("size")
        if not isinstance(size, int) or size < 0:
            raise InvalidArgument(f"{what} layer {digest}: no valid size")
        if size > max_bytes:
            raise InvalidArgument(f"{what} layer {digest} claims {size} bytes; this node takes "
                                  f"layers of at most {max_bytes} bytes (TarLimits.max_bytes)")
        out.append(LayerDesc(digest, size, kind, check_digest(diff_id)))
    return out


class _Puller:
    """One pull: client, names for messages, and the layer map."""

    def __init__(self, svc: ImageService, client: RegistryClient, repo: str, ref: str,
                 progress: Progress | None) -> None:
        self.svc, self.client, self.repo, self.ref = svc, client, repo, ref
        self.progress = progress or (lambda *a: None)
        self.map = LayerMap(svc.store)
        self.lock = threading.Lock()
        self.fetched = 0

    def manifest(self, reference: str) -> tuple[str, dict]:
        what = f"manifest of image {self.ref}"
        media, data, digest = self.client.manifest(self.repo, reference, what)
        doc = json.loads(data)
        for _ in range(2):  # an index, perhaps nested once
            if media not in INDEX_TYPES and "manifests" not in doc:
                break
            chosen = select_platform(doc, f"image {self.ref}")
            media, data, digest = self.client.manifest(self.repo, chosen, what)
            doc = json.loads(data)
        if not isinstance(doc, dict):
            raise InvalidArgument(f"{what} is not a JSON object")
        return digest, doc

    def layer(self, desc: LayerDesc) -> LayerRef:
        lid = layer_id(desc.digest)
        known = self.map.get(desc.digest) or self.map.get(desc.diff_id or desc.digest)
        if known is not None:
            self.progress(lid, "present", desc.size, desc.size)
            return known
        what = f"image {self.ref} layer {desc.digest}"
        work = self.svc.store.tempdir("pull-")
        try:
            blob = work / "blob"
            self._download(desc, blob, what, lid)
            self.progress(lid, "convert", desc.size, desc.size)
            ref = self._convert(desc, blob, what)
            self.map.put([desc.digest, desc.diff_id], ref)
            self.progress(lid, "done", desc.size, desc.size)
            return ref
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _download(self, desc: LayerDesc, dest: pathlib.Path, what: str, lid: str) -> None:
        h, got = hashlib.sha256(), 0
        self.progress(lid, "fetch", 0, desc.size)
        try:
            with self.client.blob(self.repo, desc.digest, what) as r, open(dest, "wb") as f:
                for block in r.iter_bytes(1 << 20):
                    got += len(block)
                    if got > desc.size:
                        raise InvalidArgument(f"{what}: the registry sent more than the "
                                              f"{desc.size} bytes the manifest declares")
                    h.update(block)
                    f.write(block)
                    self.progress(lid, "fetch", got, desc.size)
        except httpx.HTTPError as exc:
            raise Unavailable(f"{what}: the download broke after {got} of {desc.size} "
                              f"bytes: {exc}") from exc
        with self.lock:
            self.fetched += got
        if got < desc.size:
            raise InvalidArgument(f"{what} is truncated: {got} of the {desc.size} bytes the "
                                  f"manifest declares")
        actual = "sha256:" + h.hexdigest()
        if actual != desc.digest:
            raise InvalidArgument(f"{what} is corrupted: its bytes hash to {actual}; "
                                  f"refusing it")

    def _convert(self, desc: LayerDesc, blob: pathlib.Path, what: str) -> LayerRef:
        from dsec.images.importer import layer_from_tar

        with open(blob, "rb") as raw, _decompress(raw, desc.compression, what) as tar:
            try:
                return layer_from_tar(self.svc, tar, self.svc.limits, desc.diff_id,
                                      name=desc.digest)
            except DSecError as exc:
                if str(exc).startswith(f"layer {desc.digest}"):
                    raise type(exc)(f"image {self.ref} {exc}") from exc
                raise type(exc)(f"{what}: {exc}") from exc
            except (OSError, EOFError, ValueError) as exc:  # broken gzip/zstd stream
                raise InvalidArgument(f"{what}: cannot decompress ({desc.compression}): "
                                      f"{exc}") from exc


@contextlib.contextmanager
def _decompress(raw: IO[bytes], kind: str, what: str):
    """A reader of the uncompressed tar (the sniffed format wins over the media type)."""
    magic = raw.read(4)
    raw.seek(0)
    if magic[:2] == b"\x1f\x8b":
        kind = "gzip"
    elif magic == b"\x28\xb5\x2f\xfd":
        kind = "zstd"
    if kind == "gzip":
        with gzip.GzipFile(fileobj=raw) as f:
            yield f
    elif kind == "zstd":
        import zstandard

        with zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True) as f:
            yield f
    else:
        yield raw


def pull_image(svc: ImageService, ref: str, tag: str | None = None,
               auth: RegistryAuth | None = None, progress: Progress | None = None,
               transport: httpx.BaseTransport | None = None) -> ImageInfo:
    """Pull ``ref`` ('host:port/repo:tag', 'repo@sha256:...', 'busybox') and tag it
    ``tag`` (default: ``ref`` itself, normalized). Returns what was tagged."""
    rr = parse_registry_ref(ref)
    name = tag or rr.local
    with RegistryClient(rr.registry, auth, transport=transport) as client:
        puller = _Puller(svc, client, rr.repository, ref, progress)
        _, doc = puller.manifest(rr.reference)
        cdesc, ldescs = parse_manifest(doc, f"manifest of image {ref}")
        cdigest = check_digest(str(cdesc.get("digest")))
        config = json.loads(client.blob_bytes(rr.repository, cdigest, MAX_CONFIG,
                                              f"config of image {ref}"))
        diff_ids = ((config.get("rootfs") or {}).get("diff_ids") or []) if isinstance(
            config, dict) else []
        descs = _layer_descs(ldescs, diff_ids, f"image {ref}", svc.limits.max_bytes)
        unique = list(dict.fromkeys(descs))
        with ThreadPoolExecutor(PARALLEL, thread_name_prefix="pull") as pool:
            futures = {d: pool.submit(puller.layer, d) for d in unique}
            for f in futures.values():  # every layer finishes (or fails) before we go on
                f.exception()
            results = {d: f.result() for d, f in futures.items()}
    layers = [results[d] for d in descs]
    digest = svc.commit(name, layers, _config(config))
    m = svc.store.get_manifest(digest)
    return ImageInfo(name=normalize_ref(name), manifest_digest=digest, layers=len(m.layers),
                     size=sum(lr.size for lr in m.layers), created=m.created)

