"""Turn tars, rootfs directories and OCI/Docker images into dsec layers and manifests."""

from __future__ import annotations

import pathlib
import shutil
from typing import IO, TYPE_CHECKING

from dsec.api.errors import DSecError, InvalidArgument
from dsec.images.layermap import LayerMap
from dsec.images.models import ImageConfig, ImageInfo, LayerInfo, LayerRef
from dsec.images.oci import HashingReader, open_image_source, uncompressed
from dsec.images.refs import layer_id, normalize_ref
from dsec.images.tarsafe import TarLimits, extract_layer

if TYPE_CHECKING:
    from dsec.images.service import ImageService

__all__ = ["layer_from_tar", "import_rootfs", "import_image"]


def layer_from_tar(svc: ImageService, fileobj: IO[bytes], limits: TarLimits,
                   want: str | None = None, name: str = "layer",
                   diff_id: str | None = None) -> LayerRef:
    """Extract a layer tar safely, convert its whiteouts, build and store an EROFS layer.

    ``want``: the digest the tar's bytes must hash to; ``diff_id``: the digest its
    uncompressed tar must hash to (the image config's). Both are checked before anything
    is stored.
    """
    work = svc.store.tempdir("import-")
    try:
        rootfs = work / "rootfs"
        rootfs.mkdir()
        reader = HashingReader(fileobj)
        if diff_id is None:
            extract_layer(reader, rootfs, limits)
        else:
            with uncompressed(reader) as tar:
                plain = HashingReader(tar)
                extract_layer(plain, rootfs, limits)
                got_plain = plain.finish()
        got = reader.finish()
        if want is not None and got != want:
            raise InvalidArgument(f"layer {name} is corrupted: its bytes hash to {got}, "
                                  f"the image says {want}")
        if diff_id is not None and got_plain != diff_id:
            raise InvalidArgument(f"layer {name} does not match the image config: its "
                                  f"uncompressed tar hashes to {got_plain}, the config's "
                                  f"diff_id is {diff_id}; refusing the archive (hostile or "
                                  f"broken), nothing was imported")
        return svc.add_layer_dir(rootfs)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def import_rootfs(svc: ImageService, src: pathlib.Path, tag: str | None = None,
                  config: ImageConfig | None = None, base: str | None = None) -> LayerInfo:
    """Import a rootfs directory or tar (any compression tarfile reads) as one layer.

    With ``tag``, also write a manifest (``base``'s layers, if given, plus this one) and tag it.
    A directory is taken as it is (it is local and trusted); a tar goes through the checks of
    :mod:`dsec.images.tarsafe`.
    """
    src = pathlib.Path(src)
    if src.is_dir():
        layer = svc.add_layer_dir(src)
    elif src.is_file():
        with open(src, "rb") as f:
            layer = layer_from_tar(svc, f, svc.limits, name=src.name)
    else:
        raise InvalidArgument(f"{src} is neither a directory nor a tar file")
    manifest = None
    if tag is not None:
        layers = [layer]
        if base is not None:
            bm = svc.manifest(base)
            layers = [*bm.layers, layer]
            config = config or bm.config
        manifest = svc.commit(tag, layers, config)
    return LayerInfo(digest=layer.digest, size=layer.size, id=layer_id(layer.digest),
                     manifest_digest=manifest, tag=normalize_ref(tag) if tag else None)


def import_image(svc: ImageService, path: pathlib.Path, tag: str | None = None,
                 ref: str | None = None) -> ImageInfo:
    """Import an OCI layout (dir or tar) or a ``docker save`` tarball; one layer per layer.

    ``ref`` picks an image when the source holds several; ``tag`` names the result
    (default: the name recorded in the source).
    """
    with open_image_source(pathlib.Path(path), ref) as image:
        name = tag or image.name
        if name is None:
            raise InvalidArgument(f"{path} records no image name; pass a tag")
        name = normalize_ref(name)
        layers = []
        known = LayerMap(svc.store)
        for src in image.layers:
            # a layer dsec exported (a Dockerfile's base, an image pushed and pulled back)
            # is the EROFS layer it came from: not converted again
            ref = next((r for r in (known.get(d) for d in (src.digest, src.diff_id) if d)
                        if r is not None), None)
            if ref is None:
                with src.open() as f:
                    try:
                        ref = layer_from_tar(svc, f, svc.limits, src.digest, src.name,
                                             diff_id=src.diff_id)
                    except DSecError:
                        raise
                    except (OSError, EOFError) as exc:  # a broken gzip/zstd stream
                        raise InvalidArgument(f"{path}: layer {src.name} cannot be "
                                              f"decompressed: {exc}") from exc
                known.put([d for d in (src.digest, src.diff_id) if d], ref)  # both verified
            layers.append(ref)
        digest = svc.commit(name, layers, image.config)
    m = svc.store.get_manifest(digest)
    return ImageInfo(name=name, manifest_digest=digest, layers=len(m.layers),
                     size=sum(lr.size for lr in m.layers), created=m.created)
