"""Layered images: content-addressed EROFS layers, manifests, tags and node-wide mounts.

An image is a manifest (ordered layer digests plus config); a layer is an EROFS image
named by the sha256 of its bytes, mounted read-only once per node, file-backed, and shared
as an overlay lower directory by every sandbox that stacks it. Layers come from a local
store or, on demand in verified 256 KiB chunks, from a remote one (``dsec.images.http``
serves a store; ``dsec.images.lazyfs`` explains the loading mechanism).
"""

from dsec.images.build import BuildFailed, BuildSpec
from dsec.images.gc import GcPlan
from dsec.images.models import ImageConfig, ImageInfo, LayerInfo, LayerRef, Manifest, ResolvedImage
from dsec.images.service import ImageService
from dsec.images.sources import RemoteConfig
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
    "RemoteConfig",
    "BuildSpec",
    "BuildFailed",
    "GcPlan",
]
