"""Garbage collection plan: which manifests and layers nothing references (pure)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["GcPlan", "plan_gc"]


class GcPlan(BaseModel):
    """What a GC pass removes (or removed)."""

    model_config = ConfigDict(extra="forbid")

    manifests: list[str] = Field(default_factory=list, description="Manifest digests removed.")
    layers: list[str] = Field(default_factory=list, description="Layer digests removed.")
    bytes_freed: int = Field(0, description="Bytes of layer blobs removed.")


def plan_gc(tags: dict[str, str], manifests: dict[str, list[str]], blobs: set[str],
            in_use: set[str]) -> GcPlan:
    """Decide what to delete.

    ``tags``: name -> manifest digest. ``manifests``: digest -> its layer digests.
    ``blobs``: layer digests present. ``in_use``: digests (layers or manifests) that live
    sandboxes hold. Kept: manifests tagged or in use, and every layer they list or that is
    in use; the rest goes.
    """
    keep_m = {d for d in manifests if d in in_use or d in set(tags.values())}
    keep_l = {lyr for d in keep_m for lyr in manifests[d]} | (in_use & blobs)
    return GcPlan(manifests=sorted(set(manifests) - keep_m), layers=sorted(blobs - keep_l))
