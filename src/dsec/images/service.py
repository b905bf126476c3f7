"""ImageService: the node's face of the layer store (resolve, mount, tag, list).

Images of the node (built, imported, pulled, pushed by the root) are shared by every
project. A snapshot a project's token makes (``pack_diff``) is that project's: its tag is
seen, listed and used only by tokens that see the project (its own, those of projects
above it, the root's; :data:`~dsec.api.scope.caller_scope`), and to every other caller it
is as a tag that does not exist. A project's snapshot never replaces a shared image or
another project's (:class:`Conflict`), nor takes a registry's name.
"""

from __future__ import annotations

import datetime as dt
import pathlib
import shutil
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from dsec.api.errors import Forbidden, InvalidArgument, NotFound
from dsec.api.scope import caller_scope, visible
from dsec.images import authoring, erofs, importer
from dsec.images.busybox import BUSYBOX_CONFIG, build_busybox_rootfs
from dsec.images.build import BuildSpec, StepRunner
from dsec.images.gc import GcPlan, plan_gc, plan_remove
from dsec.images.models import (ImageConfig, ImageInfo, LayerInfo, LayerRef, Manifest,
                                ResolvedImage)
from dsec.images.mounts import LayerMounts, StoreLock
from dsec.images.refs import (check_digest, check_tag_owner, has_registry_host, is_digest,
                              normalize_ref)
from dsec.images.registry import RegistryAuth, RegistryPolicy
from dsec.images.sources import LayerSources, RemoteConfig
from dsec.images.store import LocalStore, hash_blob, table_digest
from dsec.images.tarsafe import TarLimits

if TYPE_CHECKING:
    from dsec.images.pull import Progress

__all__ = ["ImageService"]

BUSYBOX_TAG = "busybox:latest"
# What every "image not found" says: the ways to get one onto the node.
IMAGE_HINT = ("Get it onto the node: `make images` (or `make run`) builds busybox and "
              "debian:12 (also tagged python:3.11); `dsec image pull HOST/REPO:TAG` takes "
              "one from an OCI registry; `dsec image import TAR --tag NAME` an OCI layout "
              "or a `docker save` tar; `dsec image build FILE.toml` builds on busybox")


class ImageService:
    """Layer blobs, manifests, tags and layer mounts, all under ``state_dir/"images"``."""

    def __init__(self, state_dir: pathlib.Path, limits: TarLimits | None = None,
                 remote: RemoteConfig | str | None = None,
                 registry: RegistryPolicy | None = None) -> None:
        """``limits``: policy for untrusted tars. ``remote``: a remote layer store (URL or
        RemoteConfig) to take manifests and layers from when they are not local.
        ``registry``: whether and how an unknown 'host/repo:tag' is pulled on first use."""
        self.limits = limits or TarLimits()
        self.registry = registry or RegistryPolicy()
        self._pull_locks: dict[str, threading.Lock] = {}
        self._claims = threading.Lock()  # a project's snapshot: checking and writing its tag
        self.root = pathlib.Path(state_dir) / "images"
        self.store = LocalStore(self.root)
        self.lock = StoreLock(self.root / ".lock")
        if isinstance(remote, str):
            remote = RemoteConfig(url=remote)
        self.sources = LayerSources(self.store, remote)
        self.mounts = LayerMounts(self.root / "mnt", self.lock, self.sources.source_for,
                                  self.sources.healthy)

    @property
    def bytes_fetched(self) -> int:
        """Bytes this node has fetched from the remote store (lazy chunks and pulls)."""
        return self.sources.cache.bytes_fetched()

    # -- lookups -----------------------------------------------------------------------
    def manifest_digest(self, ref: str) -> str:
        """The manifest digest a tag or digest reference names; NotFound if unknown."""
        if is_digest(ref):
            try:
                self.store.manifest_bytes(ref)  # raises NotFound / CorruptBlob
            except NotFound:
                if self.sources.fetch_manifest(ref) is None:
                    raise
            return ref
        record = self.store.tag_record(normalize_ref(ref))
        if record is not None:
            if not _seen(record[1]):  # another project's snapshot: as no tag (no pull)
                raise self._not_found(ref)
            return record[0]
        digest = None
        if self.sources.remote is not None:
            digest = self.pull(ref)
        if digest is None and self.registry.pull_on_first_use and has_registry_host(ref):
            digest = self._pull_once(ref)
        if digest is None:
            raise self._not_found(ref)
        return digest

    def _not_found(self, ref: str) -> NotFound:
        known = [name for name, (_, project) in self.store.tag_records().items()
                 if _seen(project)]
        shown = ", ".join(known[:20]) + (" ..." if len(known) > 20 else "")
        return NotFound(f"image {ref!r} not found; known: {shown or '(none)'}. {IMAGE_HINT}")

    def check_visible(self, refs: list[str]) -> None:
        """NotFound, as :meth:`manifest_digest` says it, for a tag among ``refs`` that is a
        snapshot of a project the caller does not see (for paths that use an image by name
        without resolving it: pooled sandboxes and fncall workers). One small read each."""
        for ref in refs:
            if is_digest(ref):
                continue
            record = self.store.tag_record(normalize_ref(ref))
            if record is not None and not _seen(record[1]):
                raise self._not_found(ref)

    def claim(self, tag: str) -> str | None:
        """The project a snapshot tagged ``tag`` by the current caller belongs to (None:
        the root's token, whose snapshots are shared), once ``tag`` is one it may write:
        new, or a snapshot of its own project or one below it. Conflict otherwise, saying
        the same whether the tag is shared or another project's (which it cannot see)."""
        project = caller_scope.get()
        if project is not None:
            self._may_write(tag, project)
        return project

    def _may_write(self, tag: str, project: str) -> None:
        name = normalize_ref(tag)
        if has_registry_host(name):
            raise InvalidArgument(f"tag {tag!r} names a registry: a registry's names are "
                                  "for images pulled from it; tag a snapshot with a plain "
                                  "name, e.g. 'workspace/repo:v1'")
        record = self.store.tag_record(name)
        if record is not None:
            check_tag_owner(name, record[1], project)

    def pull(self, ref: str) -> str:
        """Take tag ``ref`` from the remote store (again): fetch its manifest, tag it here.

        Layer data is not fetched here; it comes on demand (or whole, with lazy=False)
        when the layer is first mounted. Returns the manifest digest.
        """
        ref = normalize_ref(ref)
        got = self.sources.fetch_manifest(ref)
        if got is None and self.sources.remote is None:
            raise NotFound(f"image {ref!r}: no remote layer store is configured")
        if got is None:
            raise NotFound(f"image {ref!r} is in neither this node's store nor the remote "
                           f"layer store. {IMAGE_HINT}")
        digest, project = got  # a project's snapshot there stays that project's here
        self.store.set_tag(ref, digest, project)
        if not _seen(project):
            raise self._not_found(ref)
        return digest

    def pull_registry(self, ref: str, tag: str | None = None, auth: RegistryAuth | None = None,
                      progress: Progress | None = None) -> ImageInfo:
        """Pull ``ref`` from an OCI distribution registry (see :mod:`dsec.images.pull`)."""
        from dsec.images.pull import pull_image

        return pull_image(self, ref, tag, auth, progress)

    def push_registry(self, ref: str, dest: str, auth: RegistryAuth | None = None,
                      progress: Progress | None = None) -> str:
        """Push image ``ref`` to a registry as an ordinary OCI image (gzip layer tars);
        returns the manifest digest there. See :mod:`dsec.images.export`."""
        from dsec.images.export import push_oci

        return push_oci(self, ref, dest, auth, progress)

    def export_oci(self, ref: str, layout: pathlib.Path, compress: bool = True) -> dict:
        """Write image ``ref`` as an OCI image layout directory; returns its manifest."""
        from dsec.images.export import export_layout

        return export_layout(self, ref, pathlib.Path(layout), compress=compress)

    def _pull_once(self, ref: str) -> str:
        """Pull on first use; concurrent creates of one image wait for one pull."""
        name = normalize_ref(ref)
        lock = self._pull_locks.setdefault(name, threading.Lock())  # atomic under the GIL
        with lock:
            digest = self.store.get_tag(name)
            if digest is None:
                host = ref.split("/", 1)[0]
                auth = RegistryAuth(insecure=host in self.registry.insecure,
                                    auth_file=self.registry.auth_file)
                digest = self.pull_registry(ref, auth=auth).manifest_digest
            return digest

    def push(self, ref: str, tag: str | None = None) -> str:
        """Upload image ``ref`` to the remote store, tagged ``tag`` (default: ``ref``).

        Layers the store already has are skipped, so pushing a pack_diff of a lazily
        loaded base uploads the new layer only. Returns the manifest digest.
        """
        remote = self.sources.remote
        if remote is None:
            raise NotFound(f"cannot push {ref!r}: no remote layer store is configured")
        digest = self.manifest_digest(ref)
        for lr in self.store.get_manifest(digest).layers:
            if not remote.has_blob(lr.digest):
                remote.push_blob(lr.digest, self.store.verify_blob(lr.digest))
        name = normalize_ref(tag or ref)
        return remote.push_manifest(name, self.store.manifest_bytes(digest))

    def manifest(self, ref: str) -> Manifest:
        """The manifest a reference names."""
        return self.store.get_manifest(self.manifest_digest(ref))

    # -- the API the container backend uses --------------------------------------------
    def resolve(self, image: str, layers: list[str] | None = None) -> ResolvedImage:
        """Mount every layer of ``image`` plus extra ``layers`` (each a tag or manifest
        digest, stacked on top in order) and return what an overlay mount needs."""
        refs = [image, *(layers or [])]
        digests = [self.manifest_digest(r) for r in refs]
        manifests = [self.store.get_manifest(d) for d in digests]
        # An extra layer tag made by pack_diff is a whole image (base + its layer): a layer
        # already in the stack is not stacked again (overlayfs refuses a repeated lowerdir).
        layer_digests = list(dict.fromkeys(lr.digest for m in manifests for lr in m.layers))
        for ref, m in zip(refs, manifests):
            for lr in m.layers:
                if not self.store.has_blob(lr.digest) and self.sources.remote is None:
                    raise NotFound(f"image {ref!r} names layer {lr.digest}, which is not "
                                   f"in the store; import or pull it again")
        mounted = [self.mounts.ensure(d) for d in layer_digests]
        return ResolvedImage(
            image=image, manifest_digest=digests[0], layer_digests=layer_digests,
            config=_merge_config(manifests), lowerdirs=list(reversed(mounted)))

    def layer_file(self, digest: str) -> pathlib.Path:
        """A verified file holding the layer's EROFS image (the local blob, or the lazy
        FUSE file of a remote layer), for consumers that attach layers as disks (microvm)."""
        with self.lock.hold():
            return self.sources.source_for(check_digest(digest))

    def list_images(self) -> list[ImageInfo]:
        """Every tag the caller sees with its manifest digest, layer count, total size and
        creation time."""
        out = []
        for name, (digest, project) in self.store.tag_records().items():
            if not _seen(project):
                continue
            try:
                m = self.store.get_manifest(digest)
            except NotFound:
                continue
            out.append(ImageInfo(name=name, manifest_digest=digest, layers=len(m.layers),
                                 size=sum(lr.size for lr in m.layers), created=m.created,
                                 project=project))
        return out

    def unmount_all(self) -> None:
        """Unmount every layer mount of this store (tests' cleanup, node shutdown), then
        stop the lazy-loading daemon if one runs."""
        self.mounts.unmount_all()
        self.sources.stop_daemon()

    def ensure_busybox(self) -> str:
        """Make sure the built-in ``busybox`` image exists; returns its manifest digest.

        Fast when it already exists; the layer is built reproducibly (fixed timestamps
        and UUID), so two processes racing here write the same blob.
        """
        digest = self.store.get_tag(BUSYBOX_TAG)
        if digest is not None:
            try:
                m = self.store.get_manifest(digest)
                if all(self.store.has_blob(lr.digest) for lr in m.layers):
                    return digest
            except NotFound:
                pass
        work = self.store.tempdir("busybox-")
        try:
            rootfs = work / "rootfs"
            rootfs.mkdir()
            build_busybox_rootfs(rootfs)
            layer = self.add_layer_dir(rootfs, all_root=True, fixed_time=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return self.commit(BUSYBOX_TAG, [layer], BUSYBOX_CONFIG)

    # -- building blocks ---------------------------------------------------------------
    def add_layer_dir(self, src: pathlib.Path, *, all_root: bool = False,
                      fixed_time: bool = False) -> LayerRef:
        """Build an EROFS layer from directory ``src`` and add it to the store."""
        work = self.store.tempdir("mkfs-")
        try:
            out = work / "layer.erofs"
            erofs.mkfs(out, src, all_root=all_root, fixed_time=fixed_time)
            return self.store.add_blob_file(out)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def commit(self, tag: str | None, layers: list[LayerRef],
               config: ImageConfig | None = None, project: str | None = None) -> str:
        """Write a manifest of ``layers`` (bottom first) and point ``tag`` at it, if given:
        ``project``'s snapshot (see :meth:`claim`, checked again here), else shared.

        Returns the manifest digest. Every layer must already be in the store.
        """
        for lr in layers:
            check_digest(lr.digest)
            if not self.store.has_blob(lr.digest) and self.store.layer_ref(lr.digest) is None:
                raise NotFound(f"layer {lr.digest} is not in the store")
        manifest = Manifest(layers=layers, config=config or ImageConfig(),
                            created=dt.datetime.now(dt.timezone.utc))
        digest = self.store.put_manifest(manifest)
        if tag is not None and project is not None:
            with self._claims:  # two projects' snapshots of one new tag: one wins
                self._may_write(tag, project)
                self.store.set_tag(tag, digest, project)
        elif tag is not None:
            self.store.set_tag(tag, digest)
        return digest

    def tag(self, ref: str, target: str) -> str:
        """Point tag ``ref`` at the manifest ``target`` (a tag or digest) names."""
        digest = self.manifest_digest(target)
        self.store.set_tag(ref, digest)
        return digest


    def untag(self, ref: str) -> None:
        """Remove tag ``ref``; NotFound if it does not exist. Layers stay until :meth:`gc`."""
        if not self.store.delete_tag(ref):
            raise NotFound(f"tag {ref!r} not found")

    def layer_ref(self, digest: str) -> LayerRef:
        """The LayerRef (digest, size, chunk table digest) of a layer in the store."""
        known = self.store.layer_ref(digest)
        if known is not None:
            return known
        path = self.store.blob_path(digest)
        if not path.is_file():
            raise NotFound(f"layer {digest} is not in the store")
        _, table = hash_blob(path)
        return LayerRef(digest=digest, size=path.stat().st_size, chunks=table_digest(table))

    # -- import --------------------------------------------------------------------------
    def import_rootfs(self, src: pathlib.Path, tag: str | None = None,
                      config: ImageConfig | None = None, base: str | None = None) -> LayerInfo:
        """Import a rootfs directory or tar as one layer; with ``tag``, tag base + it."""
        return importer.import_rootfs(self, src, tag, config, base)

    def import_image(self, path: pathlib.Path, tag: str | None = None,
                     ref: str | None = None) -> ImageInfo:
        """Import an OCI image layout (dir or tar) or a ``docker save`` tarball."""
        return importer.import_image(self, path, tag, ref)

    # -- snapshots and housekeeping ----------------------------------------------------
    def pack_diff(self, upperdir: pathlib.Path, tag: str, base: ResolvedImage,
                  exclude: list[str] | None = None,
                  config: ImageConfig | None = None) -> LayerInfo:
        """Turn a sandbox's overlay upper dir into a new layer and tag base + that layer.

        Whiteouts and opaque directories are kept, so the tagged image reproduces the
        sandbox's filesystem as it was. ``exclude``: sandbox paths or globs to clean out
        first (e.g. ``["/tmp", "/root/.cache"]``). The upper dir is only read; pack a
        paused or stopped sandbox for a consistent snapshot. The overlay must be mounted
        with redirect_dir=off and metacopy=off (the kernel's defaults). Made for a
        project's token, the tag is that project's (:meth:`claim`).
        """
        return authoring.pack_diff(self, upperdir, tag, base, exclude, config,
                                   project=self.claim(tag))

    def build(self, spec: BuildSpec | pathlib.Path, context: pathlib.Path | None = None,
              runner: StepRunner | None = None,
              progress: Callable[[int, int, str], None] | None = None) -> LayerInfo:
        """Build a layer from a spec (a BuildSpec or a TOML/JSON spec file); tag base + it.

        ``context``: folder copy steps read from (default: the spec file's folder).
        ``runner``: how run steps execute (default: unshare + chroot).
        ``progress(i, n, text)`` is called before each step. See :mod:`dsec.images.build`.
        """
        return authoring.build(self, spec, context, runner, progress)

    def build_dockerfile(self, dockerfile: pathlib.Path, tag: str,
                         context: pathlib.Path | None = None,
                         build_args: dict[str, str] | None = None,
                         auth: RegistryAuth | None = None,
                         network: dict[str, bool] | None = None) -> ImageInfo:
        """Build a Dockerfile with buildah and tag the result; RUN steps have no network
        unless ``network`` grants named permissions of the node's ``network.json``. See
        :mod:`dsec.images.dockerfile`."""
        from dsec.images.dockerfile import build_dockerfile

        return build_dockerfile(self, dockerfile, tag, context, build_args, auth,
                                network=network)

    def merge(self, ref: str, tag: str, start: int = 0, count: int | None = None) -> LayerInfo:
        """Merge layers ``start .. start+count`` of image ``ref`` into one; tag the result.

        The new manifest lists the layers below the range, the merged layer, then the
        layers above it, so the image's filesystem is unchanged.
        """
        return authoring.merge(self, ref, tag, start, count)

    def gc(self, in_use: set[str] | None = None, grace_s: float = 600.0) -> GcPlan:
        """Delete manifests no tag names, and layers (blobs and cached chunks) that no
        kept manifest lists.

        ``in_use``: layer or manifest digests live sandboxes hold (kept). Files younger
        than ``grace_s`` are kept too, so a build that has written its layer but not yet
        its tag is not collected from under it. Returns what was removed.
        """
        in_use = set(in_use or ())
        now = time.time()
        with self.lock.hold():
            manifests = self._manifest_layers()
            cached = self.sources.cache.layers()
            plan = plan_gc(self.store.tags(), manifests, self.store.blob_digests() | cached,
                           in_use)
            young = {d for d in [*plan.layers, *plan.manifests] if now - self._mtime(d) < grace_s}
            plan.layers = [d for d in plan.layers if d not in young]
            plan.manifests = [d for d in plan.manifests if d not in young]
            self._delete(plan)
        return plan

    def remove(self, ref: str, in_use: set[str] | None = None) -> GcPlan:
        """Untag ``ref`` and delete what only it kept: its manifest, unless another tag
        names it, and its layers that no other manifest lists. ``in_use``: layer or
        manifest digests live sandboxes hold (kept). NotFound if the tag does not exist,
        or is a snapshot of a project the caller does not see; a caller scoped to a
        project removes only snapshots of its projects, never a shared image (Forbidden)."""
        ref = normalize_ref(ref)
        with self.lock.hold():
            record = self.store.tag_record(ref)
            if record is None or not _seen(record[1]):
                raise NotFound(f"tag {ref!r} not found")
            if record[1] is None and caller_scope.get() is not None:
                raise Forbidden(f"image {ref!r} is shared by every project: only an admin of "
                                "the root project removes it; a project's admin removes its "
                                "projects' snapshots")
            digest = record[0]
            if not self.store.delete_tag(ref):
                raise NotFound(f"tag {ref!r} not found")
            plan = plan_remove(digest, self.store.tags(), self._manifest_layers(),
                               set(in_use or ()))
            self._delete(plan)
        return plan

    def _manifest_layers(self) -> dict[str, list[str]]:
        manifests = {}
        for d in self.store.manifest_digests():
            try:
                manifests[d] = [lr.digest for lr in self.store.get_manifest(d).layers]
            except Exception:  # corrupt or unreadable: collected like an orphan
                manifests[d] = []
        return manifests

    def _delete(self, plan: GcPlan) -> None:
        for d in plan.layers:
            self.mounts.unmount(d)
            plan.bytes_freed += self.store.remove_blob(d) + self.sources.cache.remove(d)
        for d in plan.manifests:
            (self.store.manifests / d.split(":", 1)[1]).unlink(missing_ok=True)

    def _mtime(self, digest: str) -> float:
        hexd = digest.split(":")[1]
        for path in (self.store.blob_path(digest), self.store.manifests / hexd,
                     self.sources.cache.root / hexd):
            if path.exists():
                return path.stat().st_mtime
        return 0.0


def _seen(project: str | None) -> bool:
    """Whether the current caller sees a tag of ``project`` (None: shared, seen by all)."""
    return project is None or visible(project)


def _merge_config(manifests: list[Manifest]) -> ImageConfig:
    """The first manifest's config, with later manifests' env and labels laid over it."""
    base = manifests[0].config
    env, labels = dict(base.env), dict(base.labels)
    for m in manifests[1:]:
        env.update(m.config.env)
        labels.update(m.config.labels)
    return base.model_copy(update={"env": env, "labels": labels})
