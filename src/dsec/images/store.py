"""The local, content-addressed layer store: blobs, manifests and tags in one directory.

Layout under ``root`` (a shared filesystem mount works the same way)::

    blobs/sha256/<hex>        EROFS layer images, named by the sha256 of their bytes
    manifests/sha256/<hex>    manifest JSON, named by the sha256 of its bytes
    tags/<quoted name:tag>.json   {"manifest": "sha256:...", "project": ...}; replaced
                              atomically ("project" only on a project's snapshot)
    layers/<hex>.json         the LayerRef (size, chunk table digest) of each known layer
    tmp/                      files being written; renamed into place when complete

Every write goes to ``tmp/`` first and is renamed into place, so a reader never sees half a
file, and two writers of one tag leave exactly one of them (the last rename wins).
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import tempfile
import urllib.parse

from dsec.api.errors import Internal, InvalidArgument, NotFound
from dsec.images.models import LayerRef, Manifest
from dsec.images.refs import check_digest, digest_hex, normalize_ref, tag_filename

__all__ = ["LocalStore", "CorruptBlob", "sha256_file", "hash_blob", "table_digest",
           "CHUNK_SIZE"]

CHUNK_SIZE = 256 << 10


class CorruptBlob(Internal):
    """A stored blob or manifest does not hash to its name; it is never used."""


def sha256_file(path: pathlib.Path) -> str:
    """'sha256:<hex>' of a file's bytes."""
    with open(path, "rb") as f:
        return "sha256:" + hashlib.file_digest(f, "sha256").hexdigest()


def hash_blob(path: pathlib.Path) -> tuple[str, bytes]:
    """One pass over a blob: its digest and its chunk table (sha256 of each CHUNK_SIZE piece)."""
    whole, table = hashlib.sha256(), bytearray()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_SIZE):
            whole.update(chunk)
            table += hashlib.sha256(chunk).digest()
    return "sha256:" + whole.hexdigest(), bytes(table)


def table_digest(table: bytes) -> str:
    """The digest a manifest records for a chunk table."""
    return "sha256:" + hashlib.sha256(table).hexdigest()


class LocalStore:
    """Blobs, manifests and tags kept in a directory tree (see module docstring)."""

    def __init__(self, root: pathlib.Path) -> None:
        self.root = pathlib.Path(root)
        self.blobs = self.root / "blobs" / "sha256"
        self.manifests = self.root / "manifests" / "sha256"
        self.tags_dir = self.root / "tags"
        self.tmp = self.root / "tmp"
        self.layer_index = self.root / "layers"
        self._verified: dict[str, tuple[int, int, int]] = {}
        for d in (self.blobs, self.manifests, self.tags_dir, self.tmp, self.layer_index):
            d.mkdir(parents=True, exist_ok=True)

    # -- blobs -------------------------------------------------------------------------
    def blob_path(self, digest: str) -> pathlib.Path:
        """Where the blob named ``digest`` lives (whether or not it exists)."""
        return self.blobs / digest_hex(digest)

    def has_blob(self, digest: str) -> bool:
        """True if the blob is present (not verified)."""
        return self.blob_path(digest).is_file()

    def add_blob_file(self, path: pathlib.Path, expect: str | None = None) -> LayerRef:
        """Move a finished file into the store under its digest; returns its LayerRef.

        With ``expect``, a file hashing to anything else is deleted and refused.
        """
        digest, table = hash_blob(path)
        if expect is not None and digest != expect:
            path.unlink(missing_ok=True)
            raise InvalidArgument(f"layer upload for {expect} hashes to {digest}; refused")
        size = path.stat().st_size
        dest = self.blob_path(digest)
        if dest.exists():
            path.unlink()
            os.utime(dest)  # fresh again: a GC grace period protects it until it is tagged
        else:
            os.chmod(path, 0o444)
            os.replace(path, dest)
        return LayerRef(digest=digest, size=size, chunks=table_digest(table))

    def verify_blob(self, digest: str) -> pathlib.Path:
        """Return the blob's path after checking its bytes hash to ``digest``.

        A blob this process verified and that has not changed since (same inode, size
        and mtime) is not hashed again.
        """
        path = self.blob_path(digest)
        try:
            st = path.stat()
        except FileNotFoundError:
            raise NotFound(f"layer {digest} is not in the store at {self.blobs}") from None
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        if self._verified.get(digest) == stamp:
            return path
        actual = sha256_file(path)
        if actual != digest:
            raise CorruptBlob(f"layer {digest} is corrupted: its bytes hash to {actual}; "
                              f"refusing to use it. Delete {path} and fetch or rebuild it.")
        self._verified[digest] = stamp
        return path

    def blob_digests(self) -> set[str]:
        """Digests of every blob present."""
        return {"sha256:" + p.name for p in self.blobs.iterdir() if len(p.name) == 64}

    # -- manifests ---------------------------------------------------------------------
    def put_manifest(self, manifest: Manifest) -> str:
        """Store ``manifest``; returns its digest."""
        return self.put_manifest_bytes(manifest.model_dump_json().encode())

    def put_manifest_bytes(self, data: bytes) -> str:
        """Store manifest JSON exactly as given (e.g. fetched remotely); returns its digest."""
        manifest = Manifest.model_validate_json(data)
        for lr in manifest.layers:
            path = self.layer_index / (digest_hex(lr.digest) + ".json")
            if not path.exists():
                self._write_atomic(path, lr.model_dump_json().encode())
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        dest = self.manifests / digest_hex(digest)
        if not dest.exists():
            self._write_atomic(dest, data)
        return digest

    def layer_ref(self, digest: str) -> LayerRef | None:
        """The LayerRef recorded for a layer by any manifest stored here, or None."""
        try:
            return LayerRef.model_validate_json(
                (self.layer_index / (digest_hex(digest) + ".json")).read_bytes())
        except FileNotFoundError:
            return None

    def remove_blob(self, digest: str) -> int:
        """Delete a blob and its index entry; returns the bytes freed."""
        path = self.blob_path(digest)
        size = path.stat().st_size if path.exists() else 0
        path.unlink(missing_ok=True)
        (self.layer_index / (digest_hex(digest) + ".json")).unlink(missing_ok=True)
        return size

    def manifest_bytes(self, digest: str) -> bytes:
        """The manifest's JSON, verified against its digest."""
        path = self.manifests / digest_hex(digest)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise NotFound(f"manifest {digest} is not in the store") from None
        actual = "sha256:" + hashlib.sha256(data).hexdigest()
        if actual != digest:
            raise CorruptBlob(f"manifest {digest} is corrupted (hashes to {actual}); "
                              f"delete {path} and fetch or rebuild it")
        return data

    def get_manifest(self, digest: str) -> Manifest:
        """The manifest named ``digest``, verified."""
        return Manifest.model_validate_json(self.manifest_bytes(check_digest(digest)))

    def manifest_digests(self) -> set[str]:
        """Digests of every manifest present."""
        return {"sha256:" + p.name for p in self.manifests.iterdir() if len(p.name) == 64}

    # -- tags --------------------------------------------------------------------------
    def set_tag(self, ref: str, manifest_digest: str, project: str | None = None) -> None:
        """Point tag ``ref`` at a manifest; atomic, the last writer wins. ``project``: the
        project whose snapshot it is (None: an image of the node, shared by every project)."""
        ref = normalize_ref(ref)
        record = {"name": ref, "manifest": check_digest(manifest_digest)}
        if project is not None:
            record["project"] = project
        self._write_atomic(self.tags_dir / tag_filename(ref), json.dumps(record).encode())

    def get_tag(self, ref: str) -> str | None:
        """The manifest digest tag ``ref`` points at, or None."""
        got = self.tag_record(ref)
        return None if got is None else got[0]

    def tag_record(self, ref: str) -> tuple[str, str | None] | None:
        """(manifest digest, project) of tag ``ref``, or None if there is no such tag."""
        path = self.tags_dir / tag_filename(normalize_ref(ref))
        try:
            record = json.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        return record["manifest"], record.get("project")

    def delete_tag(self, ref: str) -> bool:
        """Remove a tag; True if it existed."""
        try:
            (self.tags_dir / tag_filename(normalize_ref(ref))).unlink()
            return True
        except FileNotFoundError:
            return False

    def tags(self) -> dict[str, str]:
        """Every tag and the manifest digest it points at, sorted by name."""
        return {name: digest for name, (digest, _) in self.tag_records().items()}

    def tag_records(self) -> dict[str, tuple[str, str | None]]:
        """Every tag and its (manifest digest, project), sorted by name."""
        out = {}
        for p in self.tags_dir.glob("*.json"):
            name = urllib.parse.unquote(p.name[:-5])
            try:
                record = json.loads(p.read_bytes())
            except FileNotFoundError:
                continue
            out[name] = (record["manifest"], record.get("project"))
        return dict(sorted(out.items()))

    # -- helpers -----------------------------------------------------------------------
    def tempdir(self, prefix: str) -> pathlib.Path:
        """A fresh directory under tmp/ (same filesystem as the store: renames are atomic)."""
        return pathlib.Path(tempfile.mkdtemp(prefix=prefix, dir=self.tmp))

    def _write_atomic(self, dest: pathlib.Path, data: bytes) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.tmp, prefix=".w-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, dest)
        except BaseException:
            pathlib.Path(tmp).unlink(missing_ok=True)
            raise
