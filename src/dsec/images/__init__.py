"""Layered images: content-addressed EROFS layers, manifests, tags and node-wide mounts.

An image is a manifest (ordered layer digests plus config); a layer is an EROFS image
named by the sha256 of its bytes, mounted read-only once per node, file-backed, and shared
as an overlay lower directory by every sandbox that stacks it.
"""

from dsec.images.models import ImageConfig, ImageInfo, LayerInfo, LayerRef, Manifest, ResolvedImage
from dsec.images.service import ImageService
from dsec.images.store import CorruptBlob
from dsec.images.tarsafe import TarLimits

__all__ = [
    "ImageService",
    "ResolvedImage",
    "ImageConfig",
    "ImageInfo",
    "LayerInfo",
    "LayerRef",
    "Manifest",
    "CorruptBlob",
    "TarLimits",
]
