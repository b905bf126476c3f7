"""Read images in the forms users have: an OCI image layout and a ``docker save`` tarball.

Both are parsed into a :class:`SourceImage`: the layer tars, bottom first, each with the
digest its bytes must hash to, plus the config. A layout may be a directory or a tar of one;
``docker save`` output holds a ``manifest.json`` (every Docker version) and, from Docker 25
on, an OCI layout too; ``manifest.json`` is preferred when present.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import pathlib
import platform
import posixpath
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO

from dsec.api.errors import InvalidArgument, NotFound
from dsec.images.models import ImageConfig
from dsec.images.refs import check_digest, digest_hex

__all__ = ["SourceLayer", "SourceImage", "open_image_source", "HashingReader", "uncompressed"]

_INDEX_TYPES = ("application/vnd.oci.image.index.v1+json",
                "application/vnd.docker.distribution.manifest.list.v2+json")
_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
REF_ANNOTATION = "org.opencontainers.image.ref.name"


@dataclass
class SourceLayer:
    """One layer tar to import: how to open it and what its bytes must hash to."""

    name: str
    open: Callable[[], IO[bytes]]
    digest: str | None
    diff_id: str | None = None
    """sha256 of the uncompressed tar, from the image config (names the layer whatever
    its compression)."""


@dataclass
class SourceImage:
    """An image read from a layout or tarball."""

    layers: list[SourceLayer]
    config: ImageConfig
    name: str | None


class HashingReader:
    """A read-only file wrapper that hashes what passes through it."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f, self.h = f, hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.h.update(data)
        return data

    def finish(self) -> str:
        """Read what is left and return 'sha256:<hex>' of everything."""
        while self.read(1 << 20):
            pass
        return "sha256:" + self.h.hexdigest()


class _Prepended:
    """A reader that yields ``head`` and then the rest of ``f`` (sniffing without seek)."""

    def __init__(self, head: bytes, f: IO[bytes]) -> None:
        self.head, self.f = head, f

    def read(self, n: int = -1) -> bytes:
        if not self.head:
            return self.f.read(n)
        if n < 0:
            data, self.head = self.head + self.f.read(), b""
            return data
        data, self.head = self.head[:n], self.head[n:]
        return data + (self.f.read(n - len(data)) if len(data) < n else b"")


@contextlib.contextmanager
def uncompressed(raw: IO[bytes], kind: str = "") -> Iterator[IO[bytes]]:
    """A reader of the uncompressed tar in ``raw``: gzip and zstd are sniffed from their
    magic bytes (which win over ``kind``, the media type's word); anything else is plain."""
    magic = raw.read(4)
    src = _Prepended(magic, raw)
    if magic[:2] == b"\x1f\x8b":
        kind = "gzip"
    elif magic == b"\x28\xb5\x2f\xfd":
        kind = "zstd"
    if kind == "gzip":
        import gzip

        with gzip.GzipFile(fileobj=src) as f:  # type: ignore[arg-type]
            yield f  # type: ignore[misc]
    elif kind == "zstd":
        import zstandard

        with zstandard.ZstdDecompressor().stream_reader(src, read_across_frames=True) as f:
            yield f
    else:
        yield src  # type: ignore[misc]


def _diff_ids(config: object, count: int, where: str) -> list[str]:
    """The config's diff_ids, one per layer: each layer's uncompressed tar must hash to its
    own, so an archive whose config and layers disagree is refused, not imported."""
    diff_ids = ((config.get("rootfs") or {}).get("diff_ids") or []) if isinstance(
        config, dict) else []
    if len(diff_ids) != count:
        raise InvalidArgument(f"{where}: the image config lists {len(diff_ids)} diff_ids for "
                              f"{count} layers; refusing an archive whose config does not "
                              f"describe its layers")
    return [check_digest(str(d)) for d in diff_ids]


class _Files:
    """Named files of a directory or of a tar archive."""

    def __init__(self, path: pathlib.Path, tar: tarfile.TarFile | None) -> None:
        self.path, self.tar = path, tar
        self.names = set(tar.getnames()) if tar else None

    def exists(self, name: str) -> bool:
        name = self._check(name)
        return name in self.names if self.tar else (self.path / name).is_file()

    def open(self, name: str) -> IO[bytes]:
        name = self._check(name)
        if self.tar is None:
            return open(self.path / name, "rb")
        if name not in self.names:
            raise NotFound(f"{self.path}: {name} is missing from the archive")
        f = self.tar.extractfile(name)
        if f is None:
            raise InvalidArgument(f"{self.path}: {name} is not a regular file")
        return f

    def json(self, name: str) -> object:
        with self.open(name) as f:
            try:
                return json.loads(f.read(64 << 20))
            except ValueError as exc:
                raise InvalidArgument(f"{self.path}: {name} is not valid JSON: {exc}") from exc

    def _check(self, name: str) -> str:
        norm = posixpath.normpath(name[2:] if name.startswith("./") else name)
        if norm.startswith(("/", "../")) or norm == "..":
            raise InvalidArgument(f"{self.path}: refers to {name!r}, outside the image")
        return norm


def _blob(digest: str) -> str:
    return "blobs/sha256/" + digest_hex(check_digest(digest))


def _config(doc: object) -> ImageConfig:
    cfg = (doc or {}).get("config") or {} if isinstance(doc, dict) else {}
    env = dict(e.split("=", 1) for e in cfg.get("Env") or [] if "=" in e)
    return ImageConfig(env=env, cwd=cfg.get("WorkingDir") or "/", user=cfg.get("User") or "root",
                       entrypoint=[*(cfg.get("Entrypoint") or []), *(cfg.get("Cmd") or [])],
                       labels={str(k): str(v) for k, v in (cfg.get("Labels") or {}).items()})


def _docker_save(files: _Files, ref: str | None) -> SourceImage:
    entries = files.json("manifest.json")
    if not isinstance(entries, list) or not entries:
        raise InvalidArgument(f"{files.path}: manifest.json lists no image")
    entry = entries[0]
    if ref is not None:
        matching = [e for e in entries if ref in (e.get("RepoTags") or [])]
        entry = matching[0] if matching else entry if len(entries) == 1 else None
        if entry is None:
            raise NotFound(f"{files.path}: no image tagged {ref!r}")
    config = files.json(entry["Config"])
    diff_ids = _diff_ids(config, len(entry["Layers"]), str(files.path))
    layers = []
    for i, name in enumerate(entry["Layers"]):
        # Blobs named by digest (Docker 25+) are checked against their name; legacy
        # 'layer.tar' files are uncompressed, so they must hash to the config's diff_id.
        want = "sha256:" + name.rsplit("/", 1)[1] if name.startswith("blobs/sha256/") else (
            diff_ids[i])
        layers.append(SourceLayer(name, lambda n=name: files.open(n), want, diff_ids[i]))
    tags = entry.get("RepoTags") or []
    return SourceImage(layers=layers, config=_config(config), name=tags[0] if tags else None)


def _pick(manifests: list[dict], ref: str | None, where: str) -> dict:
    if ref is not None:
        hits = [m for m in manifests
                if ref in ((m.get("annotations") or {}).get(REF_ANNOTATION),
                           (m.get("annotations") or {}).get("io.containerd.image.name"))]
        if hits:
            return hits[0]
    plat = [m for m in manifests if (m.get("platform") or {}).get("architecture") == _ARCH]
    if ref is not None and len(manifests) > 1 and not plat:
        raise NotFound(f"{where}: no manifest named {ref!r}")
    return (plat or manifests)[0]


def _oci_layout(files: _Files, ref: str | None) -> SourceImage:
    index = files.json("index.json")
    desc = _pick(index.get("manifests") or [], ref, str(files.path))
    name = (desc.get("annotations") or {}).get(REF_ANNOTATION)
    for _ in range(4):  # nested indexes (multi-platform images)
        if desc.get("mediaType") not in _INDEX_TYPES:
            break
        desc = _pick(files.json(_blob(desc["digest"])).get("manifests") or [], None,
                     str(files.path))
    manifest = files.json(_blob(desc["digest"]))
    config = files.json(_blob(manifest["config"]["digest"]))
    descs = manifest.get("layers") or []
    diff_ids = _diff_ids(config, len(descs), str(files.path))
    layers = [SourceLayer(_blob(d["digest"]), lambda n=_blob(d["digest"]): files.open(n),
                          d["digest"], diff_ids[i])
              for i, d in enumerate(descs)]
    return SourceImage(layers=layers, config=_config(config), name=name)


@contextlib.contextmanager
def open_image_source(path: pathlib.Path, ref: str | None = None) -> Iterator[SourceImage]:
    """Open an OCI layout (directory or tar) or a ``docker save`` tarball."""
    path = pathlib.Path(path)
    if not path.exists():
        raise NotFound(f"{path} does not exist")
    with contextlib.ExitStack() as stack:
        tar = None
        if path.is_file():
            try:
                tar = stack.enter_context(tarfile.open(path, "r:*"))
            except tarfile.TarError as exc:
                raise InvalidArgument(f"{path} is neither a directory nor a tar archive") from exc
        files = _Files(path, tar)
        if files.exists("manifest.json"):
            parse = _docker_save
        elif files.exists("index.json"):
            parse = _oci_layout
        else:
            raise InvalidArgument(f"{path} is neither an OCI image layout (no index.json) "
                                  f"nor a 'docker save' tarball (no manifest.json)")
        try:
            image = parse(files, ref)
        except (KeyError, TypeError, AttributeError, IndexError) as exc:
            raise InvalidArgument(f"{path}: malformed image metadata ({exc!r})") from exc
        yield image
