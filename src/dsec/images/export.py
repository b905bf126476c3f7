"""dsec images as ordinary OCI images: an OCI layout on disk, or pushed to a registry.

Each EROFS layer is mounted privately (read-only, in a temp dir) and written as a layer tar
with the OCI forms of overlay markers: a whiteout (char device 0/0) becomes an empty
``.wh.NAME``, an opaque directory gets ``.wh..wh..opq``. The tar is gzip-compressed while
both digests (blob and diff_id) are computed in the same pass, and both are recorded in
the layer map, so pulling the image back, or building a Dockerfile on it, finds the
EROFS layer it came from instead of converting the tar again.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import pathlib
import posixpath
import shutil
import stat
import tarfile
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING

from dsec.api.errors import InvalidArgument
from dsec.images import erofs
from dsec.images.layermap import LayerMap
from dsec.images.models import ImageConfig, LayerRef
from dsec.images.refs import layer_id, normalize_ref, parse_registry_ref
from dsec.images.registry import RegistryAuth, RegistryClient
from dsec.images.stage import walk
from dsec.images.whiteout import is_opaque, is_whiteout
from dsec.node.host import fdtree

if TYPE_CHECKING:
    from dsec.images.service import ImageService

__all__ = ["export_layout", "push_oci", "OciLayer"]

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
REF_NAME = "org.opencontainers.image.ref.name"


@dataclass(frozen=True)
class OciLayer:
    """One exported layer: the blob's digest and size and the tar's diff_id."""

    digest: str
    size: int
    diff_id: str
    media_type: str


class _HashWriter:
    """A write-only file wrapper that hashes what passes through it."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f, self.h, self.n = f, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.h.update(data)
        self.n += len(data)
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()

    def digest(self) -> str:
        return "sha256:" + self.h.hexdigest()


def _tar_tree(root: pathlib.Path, tar: tarfile.TarFile) -> None:
    """Add every entry under ``root`` (sorted, numeric owners), markers in OCI form."""
    links: dict[int, str] = {}
    for dirpath, dirnames, filenames in walk(root):
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir != "." and is_opaque(dirpath):
            tar.addfile(_info(f"{rel_dir}/.wh..wh..opq", tarfile.REGTYPE))
        names = sorted(dirnames + filenames)
        for name in names:
            path = os.path.join(dirpath, name)
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            st = os.lstat(path)
            if is_whiteout(st):
                tar.addfile(_info(posixpath.join(posixpath.dirname(rel), ".wh." + name),
                                  tarfile.REGTYPE))
                continue
            ti = _info(rel, tarfile.REGTYPE, st)
            if stat.S_ISDIR(st.st_mode):
                ti.type = tarfile.DIRTYPE
            elif stat.S_ISLNK(st.st_mode):
                ti.type, ti.linkname = tarfile.SYMTYPE, os.readlink(path)
            elif stat.S_ISFIFO(st.st_mode):
                ti.type = tarfile.FIFOTYPE
            elif stat.S_ISREG(st.st_mode):
                if st.st_nlink > 1 and st.st_ino in links:
                    ti.type, ti.linkname = tarfile.LNKTYPE, links[st.st_ino]
                else:
                    if st.st_nlink > 1:
                        links[st.st_ino] = rel
                    ti.size = st.st_size
                    with open(path, "rb") as f:
                        tar.addfile(ti, f)
                    continue
            else:
                continue  # devices and sockets are not layer content
            tar.addfile(ti)


def _info(name: str, kind: bytes, st: os.stat_result | None = None) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type = kind
    if st is not None:
        ti.mode, ti.uid, ti.gid = stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid
        ti.mtime = int(st.st_mtime)
    else:
        ti.mode, ti.mtime = 0o644, 0
    return ti


def export_layer(svc: ImageService, layer: LayerRef, out: pathlib.Path,
                 compress: bool = True) -> OciLayer:
    """Write EROFS layer ``layer`` as an OCI layer tar (gzip unless ``compress`` is False)."""
    mnt = svc.store.tempdir("export-")
    try:
        erofs.mount_file(svc.layer_file(layer.digest), mnt)
        try:
            with open(out, "wb") as raw:
                outer = _HashWriter(raw)
                gz = (gzip.GzipFile(fileobj=outer, mode="wb", mtime=0, compresslevel=6)
                      if compress else None)
                inner = _HashWriter(gz if gz is not None else raw)
                with tarfile.open(fileobj=inner, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                    _tar_tree(mnt, tar)
                if gz is not None:
                    gz.close()
        finally:
            erofs.umount(mnt)
    finally:
        shutil.rmtree(mnt, ignore_errors=True)
    blob = outer.digest() if compress else inner.digest()
    result = OciLayer(blob, out.stat().st_size, inner.digest(),
                      OCI_LAYER_GZIP if compress else OCI_LAYER)
    LayerMap(svc.store).put([result.digest, result.diff_id], layer)
    return result


def oci_config(config: ImageConfig, diff_ids: list[str]) -> bytes:
    """The OCI image config of a dsec image config (its command as Cmd)."""
    doc = {"architecture": "amd64", "os": "linux",
           "config": {"Env": [f"{k}={v}" for k, v in config.env.items()],
                      "WorkingDir": config.cwd, "User": config.user if config.user != "root"
                      else "", "Cmd": config.entrypoint or None, "Labels": config.labels},
           "rootfs": {"type": "layers", "diff_ids": diff_ids}}
    return json.dumps(doc, sort_keys=True).encode()


def _put_blob(layout: pathlib.Path, data: bytes) -> dict:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    (layout / "blobs" / "sha256" / digest[7:]).write_bytes(data)
    return {"digest": digest, "size": len(data)}


def export_layout(svc: ImageService, ref: str, layout: pathlib.Path, *,
                  name: str | None = None, compress: bool = True) -> dict:
    """Write image ``ref`` as an OCI image layout at ``layout`` (an empty or new dir).

    ``name`` is the ref.name annotation (default: ``ref``'s tag). Returns the manifest.
    """
    m = svc.manifest(ref)
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    layers = []
    for lr in m.layers:
        tmp = blobs / f".tmp-{lr.digest[7:]}"
        done = export_layer(svc, lr, tmp, compress)
        os.replace(tmp, blobs / done.digest[7:])
        layers.append(done)
    config = oci_config(m.config, [x.diff_id for x in layers])
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                "config": {"mediaType": OCI_CONFIG, **_put_blob(layout, config)},
                "layers": [{"mediaType": x.media_type, "digest": x.digest, "size": x.size}
                           for x in layers]}
    data = json.dumps(manifest).encode()
    tag = name or (ref.rsplit(":", 1)[1] if ":" in ref and not ref.startswith("sha256:")
                   else "latest")
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
             "manifests": [{"mediaType": OCI_MANIFEST, **_put_blob(layout, data),
                            "annotations": {REF_NAME: tag}}]}
    (layout / "index.json").write_text(json.dumps(index))
    return manifest


def push_oci(svc: ImageService, ref: str, dest: str, auth: RegistryAuth | None = None,
             progress=None) -> str:
    """Push image ``ref`` to registry reference ``dest`` as an ordinary OCI image.

    Blobs the repository already has are not uploaded. Returns the manifest digest.
    """
    rr = parse_registry_ref(dest)
    if rr.by_digest:
        raise InvalidArgument(f"push to a tag, not a digest: {dest!r}")
    report = progress or (lambda *a: None)
    work = svc.store.tempdir("push-")
    try:
        manifest = export_layout(svc, ref, work / "layout", name=rr.reference)
        blobs = work / "layout" / "blobs" / "sha256"
        with RegistryClient(rr.registry, auth) as client:
            descs = [*manifest["layers"], manifest["config"]]
            for desc in descs:
                what = f"image {normalize_ref(dest)} blob {desc['digest']}"
                lid = layer_id(desc["digest"])
                if client.has_blob(rr.repository, desc["digest"], what):
                    report(lid, "present", desc["size"], desc["size"])
                    continue
                report(lid, "upload", 0, desc["size"])
                client.push_blob(rr.repository, desc["digest"], blobs / desc["digest"][7:], what)
                report(lid, "done", desc["size"], desc["size"])
            return client.put_manifest(rr.repository, rr.reference, OCI_MANIFEST,
                                       json.dumps(manifest).encode(),
                                       f"manifest of image {normalize_ref(dest)}")
    finally:
        fdtree.rmtree(work)
