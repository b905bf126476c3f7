"""Making layers from sandboxes and layers: pack_diff, build from a spec, merge."""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from dsec.api.errors import InvalidArgument, NotFound
from dsec.images import erofs
from dsec.images.build import BuildSpec, ChrootRunner, StepRunner, load_spec, run_steps
from dsec.images.merge import merge_trees
from dsec.images.models import ImageConfig, LayerInfo, ResolvedImage
from dsec.images.refs import layer_id, normalize_ref
from dsec.images.stage import stage_upper
from dsec.node.host import fdtree

if TYPE_CHECKING:
    from dsec.images.service import ImageService

__all__ = ["pack_diff", "build", "merge"]


def pack_diff(svc: ImageService, upperdir: pathlib.Path, tag: str, base: ResolvedImage,
              exclude: list[str] | None = None, config: ImageConfig | None = None,
              project: str | None = None) -> LayerInfo:
    """Turn a sandbox's overlay upper dir into a new layer and tag base + that layer.

    Whiteouts and opaque directories are kept, so the tagged image reproduces the
    sandbox's filesystem as it was. ``exclude``: sandbox paths or globs to clean out
    first (e.g. ``["/tmp", "/root/.cache"]``). The upper dir is only read; pack a
    paused or stopped sandbox for a consistent snapshot. ``project``: whose snapshot the
    tag is (None: shared).
    """
    tag = normalize_ref(tag)
    if not pathlib.Path(upperdir).is_dir():
        raise NotFound(f"upper directory {upperdir} does not exist")
    work = svc.store.tempdir("pack-")
    try:
        rootfs = work / "rootfs"
        rootfs.mkdir()
        stage_upper(pathlib.Path(upperdir), rootfs, exclude)
        layer = svc.add_layer_dir(rootfs)
    finally:
        fdtree.rmtree(work)
    layers = [svc.layer_ref(d) for d in base.layer_digests] + [layer]
    digest = svc.commit(tag, layers, config or base.config, project=project)
    return LayerInfo(digest=layer.digest, size=layer.size, id=layer_id(layer.digest),
                     manifest_digest=digest, tag=tag)

def build(svc: ImageService, spec: BuildSpec | pathlib.Path, context: pathlib.Path | None = None,
          runner: StepRunner | None = None,
          progress: Callable[[int, int, str], None] | None = None) -> LayerInfo:
    """Build a layer from a spec (a BuildSpec or a spec file) and tag base + it.

    ``context``: folder copy steps read from (default: the spec file's folder).
    ``progress(i, n, text)`` is called before each step. See :mod:`dsec.images.build`.
    """
    if not isinstance(spec, BuildSpec):
        context = context or pathlib.Path(spec).parent
        spec = load_spec(pathlib.Path(spec))
    context = pathlib.Path(context or ".")
    base = svc.resolve(spec.base, spec.layers)
    env = {**base.config.env, **spec.env}
    work = svc.store.tempdir("build-")
    merged, upper, scratch = work / "merged", work / "upper", work / "work"
    for d in (merged, upper, scratch):
        d.mkdir()
    try:
        erofs.mount_overlay(base.lowerdirs, upper, scratch, merged)
        try:
            run_steps(spec, context, merged, env, runner or ChrootRunner(), progress)
        finally:
            erofs.umount(merged)
        config = base.config.model_copy(update={
            "env": env, "cwd": spec.workdir or base.config.cwd,
            "labels": {**base.config.labels, **spec.labels},
            "entrypoint": spec.entrypoint if spec.entrypoint is not None
            else base.config.entrypoint})
        return svc.pack_diff(upper, spec.tag, base, spec.exclude, config)
    finally:
        fdtree.rmtree(work)

def merge(svc: ImageService, ref: str, tag: str, start: int = 0, count: int | None = None) -> LayerInfo:
    """Merge layers ``start .. start+count`` of image ``ref`` into one; tag the result.

    The new manifest lists the layers below the range, the merged layer, then the
    layers above it, so the image's filesystem is unchanged. Whiteouts and opaque
    markers are kept where layers below the range still need hiding.
    """
    m = svc.manifest(ref)
    end = len(m.layers) if count is None else start + count
    if not 0 <= start < end <= len(m.layers):
        raise InvalidArgument(f"cannot merge layers {start}..{end} of {ref!r}: it has "
                              f"{len(m.layers)} layers (start from 0, count at least 1)")
    dirs = [svc.mounts.ensure(lr.digest) for lr in m.layers[start:end]]
    below = [svc.mounts.ensure(lr.digest) for lr in m.layers[:start]]
    work = svc.store.tempdir("merge-")
    try:
        rootfs = work / "rootfs"
        rootfs.mkdir()
        merge_trees(dirs, rootfs, below)
        layer = svc.add_layer_dir(rootfs)
    finally:
        fdtree.rmtree(work)
    digest = svc.commit(tag, [*m.layers[:start], layer, *m.layers[end:]], m.config)
    return LayerInfo(digest=layer.digest, size=layer.size, id=layer_id(layer.digest),
                     manifest_digest=digest, tag=normalize_ref(tag))
