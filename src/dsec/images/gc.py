"""Garbage collection plan: which manifests and layers nothing references (pure)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["GcPlan", "plan_gc", "plan_remove"]


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


def plan_remove(digest: str, tags: dict[str, str], manifests: dict[str, list[str]],
                in_use: set[str]) -> GcPlan:
    """What goes with an image whose tag was removed: its manifest ``digest``, unless a
    tag still names it or a sandbox holds it, and those of its layers that no other
    manifest lists (tagged or not: a build may not have tagged its own yet) and no sandbox
    holds. Arguments as for :func:`plan_gc`, ``tags`` without the removed one."""
    if digest in in_use or digest in set(tags.values()):
        return GcPlan()
    others = {lyr for d, layers in manifests.items() if d != digest for lyr in layers}
    mine = set(manifests.get(digest, []))
    return GcPlan(manifests=[digest], layers=sorted(mine - others - in_use))
