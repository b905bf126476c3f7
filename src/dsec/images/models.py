"""Typed models of the layer store: manifests, image config, resolved images."""

from __future__ import annotations

import datetime as dt
import pathlib

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ImageConfig", "LayerRef", "Manifest", "ResolvedImage", "ImageInfo", "LayerInfo"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ImageConfig(_Model):
    """What a sandbox inherits from its image besides the filesystem."""

    env: dict[str, str] = Field(default_factory=dict, description="Environment variables.")
    cwd: str = Field("/", description="Working directory of processes started in the sandbox.")
    user: str = Field("root", description="User name or uid[:gid] processes run as.")
    entrypoint: list[str] = Field(default_factory=list, description="Default command, if any.")
    labels: dict[str, str] = Field(default_factory=dict, description="Free-form metadata.")


class LayerRef(_Model):
    """One layer of a manifest: the digest of its EROFS blob and the blob's size."""

    digest: str = Field(description="'sha256:<64 hex>' of the EROFS blob.")
    size: int = Field(ge=0, description="Size of the blob in bytes.")
    chunks: str | None = Field(
        None, description="'sha256:...' of the blob's chunk table (the raw sha256 of each "
                          "256 KiB chunk, concatenated): lets a node verify chunks it fetches "
                          "on demand before it has the whole blob.")


class Manifest(_Model):
    """An image: ordered layers (bottom first) and config. Named by the sha256 of its JSON."""

    schema_version: int = Field(1, description="Version of this document's shape.")
    layers: list[LayerRef] = Field(description="Layers, bottom-most first.")
    config: ImageConfig = Field(default_factory=ImageConfig, description="Image config.")
    created: dt.datetime = Field(description="When the manifest was written (UTC).")


class ResolvedImage(_Model):
    """An image ready to be stacked: every layer mounted read-only on this node."""

    image: str = Field(description="The reference as it was asked for.")
    manifest_digest: str = Field(description="'sha256:...' of the image's manifest.")
    layer_digests: list[str] = Field(description="All layers, bottom-most first.")
    config: ImageConfig = Field(description="Config of the image, extra layers' env/labels merged.")
    lowerdirs: list[pathlib.Path] = Field(
        description="Layer mount points, TOP-MOST first, as overlayfs 'lowerdir=' expects.")

    @property
    def lowerdir_option(self) -> str:
        """The value of overlayfs' ``lowerdir=`` option."""
        return ":".join(str(p) for p in self.lowerdirs)


class ImageInfo(_Model):
    """One tag as listed by :meth:`ImageService.list_images`."""

    name: str = Field(description="'name:tag'.")
    manifest_digest: str = Field(description="'sha256:...' of the manifest the tag points at.")
    layers: int = Field(description="Number of layers.")
    size: int = Field(description="Total size of the layer blobs in bytes.")
    created: dt.datetime = Field(description="When the manifest was written (UTC).")
    project: str | None = Field(None, description="The project whose snapshot it is; None: "
                                                  "shared by every project.")


class LayerInfo(_Model):
    """A layer just built (by pack_diff, import or merge)."""

    digest: str = Field(description="'sha256:...' of the EROFS blob.")
    size: int = Field(description="Size of the blob in bytes.")
    id: str = Field(description="'lyr-' followed by the first 12 hex digits of the digest.")
    manifest_digest: str | None = Field(None, description="Manifest written with it, if any.")
    tag: str | None = Field(None, description="Tag pointed at that manifest, if any.")
