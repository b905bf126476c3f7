"""``dsec image ...``: build, import and manage images in this node's layer store.

Unlike the other commands these do not talk to a server: they open the layer store under
the node's state directory (``--state-dir``, else $DSEC_STATE_DIR, else /var/lib/dsec)
directly, so they run on the node machine, as root (builds and merges mount layers).
A running node sees what they write at once: tags are files replaced atomically.
"""

from __future__ import annotations

import functools
import os
import re
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer
from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn,
                           TimeElapsedColumn)
from rich.text import Text

from dsec.cli.common import JsonOpt, cli_errors, err, fail, mib, out, parse_pairs, print_json
from dsec.cli.images import image_table

if TYPE_CHECKING:
    from dsec.images import ImageInfo, ImageService, LayerInfo

__all__ = ["image_app", "detect_image_kind", "overlay_layers", "is_dockerfile"]

ON_NODE = "Runs on the node machine, as root, against its local layer store."
DEFAULT_STATE_DIR = Path("/var/lib/dsec")

image_app = typer.Typer(
    name="image", no_args_is_help=True, add_completion=False,
    help="Build, import and manage images in this node's layer store. " + ON_NODE)

StateDir = Annotated[Path, typer.Option(
    "--state-dir", envvar="DSEC_STATE_DIR", show_default=True,
    help="the node's state directory (its layer store is STATE_DIR/images)")]
Tag = Annotated[str, typer.Option("--tag", "-t", help="tag of the result, e.g. "
                                                      "'workspace/repo:v1'")]

F = TypeVar("F", bound=Callable)


def on_node(fn: F) -> F:
    """cli_errors, plus one line for OS errors (a store this user cannot write: not root)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except PermissionError as exc:
            fail(f"{exc}; dsec image commands run on the node machine as root")
        except OSError as exc:
            fail(str(exc))
    return cli_errors(wrapper)  # type: ignore[return-value]


def _service(state_dir: Path, remote: str | None = None,
             token: str | None = None) -> ImageService:
    from dsec.images import ImageService, RemoteConfig  # the store loads only here

    return ImageService(state_dir, remote=RemoteConfig(url=remote, token=token)
                        if remote else None)


def _ensure_builtin(svc: ImageService, refs: list[str | None]) -> None:
    """Make the built-in busybox image on first use, as the node does when it starts."""
    if any(r in ("busybox", "busybox:latest") for r in refs):
        svc.ensure_busybox()


def _print_layer(info: LayerInfo, as_json: bool = False) -> None:
    if as_json:
        return print_json(info)
    if info.tag:
        out.print(f"tag       {info.tag}")
    out.print(f"layer     {info.digest}  ({info.id}, {mib(info.size)})")
    if info.manifest_digest:
        out.print(f"manifest  {info.manifest_digest}")


def _print_image(info: ImageInfo, as_json: bool = False) -> None:
    if as_json:
        return print_json(info)
    out.print(f"tag       {info.name}")
    out.print(f"manifest  {info.manifest_digest}")
    out.print(f"layers    {info.layers} ({mib(info.size)})")


@image_app.command()
@on_node
def build(
    spec: Annotated[Path, typer.Argument(
        help="a Dockerfile (named Dockerfile, Containerfile or *.Dockerfile) or a dsec "
             "spec file (TOML, or JSON if it ends in .json)")],
    context: Annotated[Path | None, typer.Option(
        help="folder COPY/copy steps read from; default: the file's folder")] = None,
    tag: Annotated[str | None, typer.Option(
        "--tag", "-t", help="tag of the result; default: the spec's 'tag'")] = None,
    build_arg: Annotated[list[str] | None, typer.Option(
        metavar="KEY=VALUE", help="Dockerfile ARG value (repeatable)")] = None,
    insecure: Annotated[bool, typer.Option(
        help="FROM images in a registry over plain HTTP (loopback/private only)")] = False,
    network: Annotated[list[str] | None, typer.Option(
        metavar="PERMISSION", help="let Dockerfile RUN steps use this named egress "
                                   "permission of the node's network.json (repeatable)")] = None,
    state_dir: StateDir = DEFAULT_STATE_DIR,
    as_json: JsonOpt = False,
) -> None:
    """Build an image from a Dockerfile (with buildah) or a dsec spec file.

    A Dockerfile's FROM names a dsec image or a registry image (pulled by dsec first). RUN
    steps have loopback only, unless --network grants permissions as create(network=) does.

    Runs on the node machine, as root, against its local layer store."""
    if is_dockerfile(spec):
        if tag is None:
            fail(f"building {spec} needs --tag (a Dockerfile does not name its image)")
        from dsec.images.registry import RegistryAuth

        svc = _service(state_dir)
        with err.status(f"building {spec} with buildah"):
            info = svc.build_dockerfile(spec, tag, context, parse_pairs(build_arg, "--build-arg"),
                                        RegistryAuth(insecure=insecure),
                                        network={n: True for n in network or ()})
        _print_image(info)
        return
    if network:
        fail(f"--network applies to Dockerfiles; a dsec spec like {spec} sets network = true")
    from dsec.images.build import load_spec

    loaded = load_spec(spec)
    if tag is not None:
        loaded = loaded.model_copy(update={"tag": tag})
    svc = _service(state_dir)
    _ensure_builtin(svc, [loaded.base, *loaded.layers])
    progress = Progress(TextColumn("{task.description}", markup=False), BarColumn(),
                        MofNCompleteColumn(), TimeElapsedColumn(), console=err, transient=True)
    with progress:
        bar = progress.add_task(f"base {loaded.base}", total=len(loaded.steps) or None)

        def step(i: int, n: int, text: str) -> None:
            progress.console.print(Text(f"step {i}/{n}: {text}"))
            progress.update(bar, total=n, completed=i - 1, description=_short(text))

        info = svc.build(loaded, context or spec.parent, progress=step)
    _print_layer(info, as_json)


def is_dockerfile(path: Path) -> bool:
    """True for 'Dockerfile', 'Containerfile', 'Dockerfile.dev', 'app.Dockerfile'."""
    name = path.name.lower()
    return name.startswith(("dockerfile", "containerfile")) or name.endswith(
        (".dockerfile", ".containerfile"))


def _short(text: str, width: int = 48) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 1] + "…"


@image_app.command("import")
@on_node
def import_(
    path: Annotated[Path, typer.Argument(
        help="OCI layout (dir or tar), `docker save` tar, or a rootfs dir or tar")],
    tag: Annotated[str | None, typer.Option(
        "--tag", "-t", help="tag of the result; default: the name the image records "
                            "(required for a rootfs)")] = None,
    rootfs: Annotated[bool, typer.Option(
        "--rootfs", help="take PATH as a root filesystem even if it looks like an image")
    ] = False,
    ref: Annotated[str | None, typer.Option(
        help="which image of a layout or tarball holding several")] = None,
    base: Annotated[str | None, typer.Option(
        help="rootfs only: stack the layer on this image (its config is kept)")] = None,
    env: Annotated[list[str] | None, typer.Option(
        metavar="KEY=VALUE", help="rootfs only: environment of the image (repeatable)")
    ] = None,
    state_dir: StateDir = DEFAULT_STATE_DIR,
    as_json: JsonOpt = False,
) -> None:
    """Import an image (OCI layout, `docker save` tar) or a rootfs (dir or tar) as a layer.

    PATH is an image if an index.json or manifest.json sits at its top, else a rootfs.

    Tar entries are checked: no '..', absolute paths, devices or links out; no setuid.

    Runs on the node machine, as root, against its local layer store."""
    if not path.exists():
        fail(f"{path} does not exist")
    if rootfs and path.is_file() and not tarfile.is_tarfile(path):
        fail(f"{path} is neither a directory nor a tar archive (plain, gzip, bzip2 or xz)")
    kind = "rootfs" if rootfs else detect_image_kind(path)
    svc = _service(state_dir)
    if kind == "image":
        if base is not None or env:
            fail(f"{path} is an image; --base and --env apply to a rootfs (add --rootfs)")
        with err.status(f"importing {path}"):
            _print_image(svc.import_image(path, tag, ref), as_json)
        return
    if tag is None:
        fail(f"importing {path} as a rootfs needs --tag (nothing else would name the layer)")
    config = None
    _ensure_builtin(svc, [base])
    if base is not None or env:
        from dsec.images import ImageConfig

        base_config = svc.manifest(base).config if base is not None else ImageConfig()
        config = base_config.model_copy(
            update={"env": {**base_config.env, **parse_pairs(env, "--env")}})
    with err.status(f"importing {path} as a rootfs"):
        _print_layer(svc.import_rootfs(path, tag, config, base), as_json)


def detect_image_kind(path: Path) -> str:
    """``"image"`` if ``path`` (dir or tar) has index.json or manifest.json at its top,
    else ``"rootfs"``. Reads only tar headers (all of them, for a rootfs)."""
    names = {"index.json", "manifest.json"}
    if path.is_dir():
        return "image" if any((path / n).is_file() for n in names) else "rootfs"
    try:
        with tarfile.open(path, "r:*") as tar:
            for member in tar:
                if member.isfile() and member.name.removeprefix("./") in names:
                    return "image"
    except (tarfile.TarError, EOFError) as exc:
        from dsec.api.errors import InvalidArgument

        raise InvalidArgument(f"{path} is neither a directory nor a tar archive (plain, "
                              f"gzip, bzip2 or xz)") from exc
    return "rootfs"


@image_app.command()
@on_node
def merge(
    ref: Annotated[str, typer.Argument(help="image whose layers to merge")],
    tag: Tag,
    start: Annotated[int, typer.Option(min=0, help="first layer to merge (0 = bottom)")] = 0,
    count: Annotated[int | None, typer.Option(
        min=1, help="how many layers to merge; default: up to the top")] = None,
    state_dir: StateDir = DEFAULT_STATE_DIR,
    as_json: JsonOpt = False,
) -> None:
    """Merge consecutive layers of an image into one (whiteouts kept) and tag the result.

    The image's filesystem is unchanged; REF itself is left as it was.

    Runs on the node machine, as root, against its local layer store."""
    svc = _service(state_dir)
    _ensure_builtin(svc, [ref])
    with err.status(f"merging layers of {ref}"):
        info = svc.merge(ref, tag, start, count)
    if as_json:
        return print_json(info)
    _print_layer(info)
    out.print(f"layers    {len(svc.manifest(info.manifest_digest).layers)}")


@image_app.command("tag")
@on_node
def tag_(
    src: Annotated[str, typer.Argument(help="existing tag or manifest digest")],
    dst: Annotated[str, typer.Argument(help="new tag, e.g. 'python:3.11'")],
    state_dir: StateDir = DEFAULT_STATE_DIR,
    as_json: JsonOpt = False,
) -> None:
    """Point tag DST at the image SRC names (DST is replaced if it exists).

    Runs on the node machine, as root, against its local layer store."""
    from dsec.images.refs import normalize_ref

    svc = _service(state_dir)
    _ensure_builtin(svc, [src])
    digest = svc.tag(normalize_ref(dst), src)
    if as_json:
        return print_json({"tag": normalize_ref(dst), "manifest_digest": digest})
    out.print(f"{normalize_ref(dst)} -> {digest}")


@image_app.command()
@on_node
def rm(
    tags: Annotated[list[str], typer.Argument(help="tags to remove")],
    state_dir: StateDir = DEFAULT_STATE_DIR,
    as_json: JsonOpt = False,
) -> None:
    """Remove tags. Their layers stay until `dsec image gc` finds nothing uses them.

    Runs on the node machine, as root, against its local layer store."""
    from dsec.images.refs import normalize_ref

    svc = _service(state_dir)
    for t in tags:
        svc.untag(normalize_ref(t))
        if not as_json:
            out.print(f"untagged {normalize_ref(t)}")
    if as_json:
        print_json({"untagged": [normalize_ref(t) for t in tags]})


@image_app.command()
@on_node
def ls(state_dir: StateDir = DEFAULT_STATE_DIR, as_json: JsonOpt = False) -> None:
    """List the images (tags) of this node's layer store, as `dsec images` does.

    Runs on the node machine, as root, against its local layer store."""
    found = _service(state_dir).list_images()
    if as_json:
        return print_json(found)
    if not found:
        err.print("no images")
        return
    out.print(image_table([(i.name, i.manifest_digest, i.layers, i.size,
                            i.created.timestamp()) for i in found]))


@image_app.command()
@on_node
def gc(
    grace: Annotated[float, typer.Option(
        min=0, help="keep files younger than this many seconds (a build in flight)")] = 600.0,
    state_dir: StateDir = DEFAULT_STATE_DIR,
    as_json: JsonOpt = False,
) -> None:
    """Delete manifests no tag names and layers no kept manifest lists.

    Layers a mounted overlay stacks (a sandbox's root filesystem) are kept.

    Runs on the node machine, as root, against its local layer store."""
    svc = _service(state_dir)
    with open("/proc/self/mounts") as f:
        in_use = overlay_layers(f.read(), svc.mounts.mnt_dir)
    plan = svc.gc(in_use=in_use, grace_s=grace)
    if as_json:
        return print_json({"layers": sorted(plan.layers), "manifests": sorted(plan.manifests),
                           "bytes_freed": plan.bytes_freed})
    for d in plan.layers:
        out.print(f"removed layer     {d}")
    for d in plan.manifests:
        out.print(f"removed manifest  {d}")
    err.print(f"removed {len(plan.layers)} layers and {len(plan.manifests)} manifests, "
              f"freed {mib(plan.bytes_freed)}")


def overlay_layers(mounts: str, mnt_dir: Path) -> set[str]:
    """Digests of the layers under ``mnt_dir`` that overlays in ``mounts`` (the text of
    /proc/self/mounts) stack. Overlayfs keeps private clones of its lower mounts, so a
    layer's own mount is never busy: the overlays' options are the only witness of use."""
    layer = re.compile(re.escape(str(mnt_dir).replace(" ", "\\040")) + r"/([0-9a-f]{64})\b")
    return {"sha256:" + m.group(1) for line in mounts.splitlines()
            if line.split(" ")[2:3] == ["overlay"] for m in layer.finditer(line)}


@image_app.command()
@on_node
def push(
    ref: Annotated[str, typer.Argument(help="tag or manifest digest to push")],
    dest: Annotated[str | None, typer.Argument(
        help="registry reference 'host:port/repo:tag' to push to as an OCI image; "
             "default: REF itself if it names a registry host")] = None,
    to: Annotated[str | None, typer.Option(
        metavar="URL", help="remote dsec layer store (a dsec gateway); default $DSEC_URL")
    ] = None,
    tag: Annotated[str | None, typer.Option(
        "--tag", "-t", help="dsec store only: tag it gets there; default REF")] = None,
    token: Annotated[str | None, typer.Option(
        envvar="DSEC_TOKEN", show_envvar=True, help="bearer token of the remote store")
    ] = None,
    insecure: Annotated[bool, typer.Option(
        help="registry over plain HTTP (only to a loopback or private address)")] = False,
    username: Annotated[str | None, typer.Option(
        envvar="DSEC_REGISTRY_USER", help="registry user; default: from ~/.docker/config.json")
    ] = None,
    password: Annotated[str | None, typer.Option(
        envvar="DSEC_REGISTRY_PASSWORD", help="registry password or token")] = None,
    authfile: Annotated[Path | None, typer.Option(
        help="credentials file (Docker config.json format)")] = None,
    state_dir: StateDir = DEFAULT_STATE_DIR,
    as_json: JsonOpt = False,
) -> None:
    """Upload an image to an OCI registry or a remote dsec layer store; skips blobs there.

    To a registry as an ordinary OCI image: DEST, or REF itself if it names a registry
    host. To a layer store (a dsec gateway, or oci://host/repo as EROFS artifacts): --to.

    Runs on the node machine, as root, against its local layer store."""
    from dsec.images.refs import has_registry_host

    local = _service(state_dir)
    _ensure_builtin(local, [ref])
    local.manifest_digest(ref)  # a local image: never pull it while pushing
    target = dest or (ref if has_registry_host(ref) and to is None else None)
    if target is not None:
        from dsec.images.registry import RegistryAuth

        auth = RegistryAuth(username=username, password=password, insecure=insecure,
                            auth_file=authfile)
        with err.status(f"pushing {ref} to {target}"):
            digest = local.push_registry(ref, target, auth)
        if as_json:
            return print_json({"pushed": ref, "manifest_digest": digest, "to": target})
        out.print(f"pushed {target} -> {digest}")
        return
    url = to or os.environ.get("DSEC_URL")
    if not url:
        fail("push needs a destination: a registry reference 'host:port/repo:tag', "
             "--to URL of a dsec layer store, or DSEC_URL")
    svc = _service(state_dir, remote=url, token=token)
    with err.status(f"pushing {ref} to {url}"):
        digest = svc.push(ref, tag)
    if as_json:
        return print_json({"pushed": tag or ref, "manifest_digest": digest, "to": url})
    out.print(f"pushed {tag or ref} -> {digest}")


@image_app.command("export")
@on_node
def export(
    ref: Annotated[str, typer.Argument(help="tag or manifest digest to export")],
    output: Annotated[Path, typer.Argument(help="OCI image layout directory to write")],
    uncompressed: Annotated[bool, typer.Option(help="plain layer tars, not gzip")] = False,
    state_dir: StateDir = DEFAULT_STATE_DIR,
    as_json: JsonOpt = False,
) -> None:
    """Write an image as an OCI image layout (what skopeo, podman and buildah read).

    Runs on the node machine, as root, against its local layer store."""
    if output.exists() and any(output.iterdir()):
        fail(f"{output} is not empty; export writes a new OCI layout")
    svc = _service(state_dir)
    _ensure_builtin(svc, [ref])
    with err.status(f"exporting {ref} to {output}"):
        m = svc.export_oci(ref, output, compress=not uncompressed)
    if as_json:
        return print_json({"exported": ref, "to": str(output), "layers": len(m["layers"])})
    out.print(f"exported {ref} -> {output} ({len(m['layers'])} layers)")


@image_app.command()
@on_node
def pull(
    ref: Annotated[str, typer.Argument(
        help="registry image: 'host:port/repo:tag', 'repo@sha256:...', 'debian:12'")],
    tag: Annotated[str | None, typer.Option(
        "--tag", "-t", help="local tag; default REF itself")] = None,
    insecure: Annotated[bool, typer.Option(
        help="plain HTTP (only to a loopback or private address)")] = False,
    username: Annotated[str | None, typer.Option(
        envvar="DSEC_REGISTRY_USER", help="registry user; default: from ~/.docker/config.json")
    ] = None,
    password: Annotated[str | None, typer.Option(
        envvar="DSEC_REGISTRY_PASSWORD", help="registry password or token")] = None,
    authfile: Annotated[Path | None, typer.Option(
        help="credentials file (Docker config.json format)")] = None,
    state_dir: StateDir = DEFAULT_STATE_DIR,
    as_json: JsonOpt = False,
) -> None:
    """Pull an image from an OCI registry: each layer fetched once, verified, made EROFS.

    Layers this store already has are not fetched again.

    Runs on the node machine, as root, against its local layer store."""
    from dsec.images.registry import RegistryAuth

    auth = RegistryAuth(username=username, password=password, insecure=insecure,
                        auth_file=authfile)
    svc = _service(state_dir)
    progress = Progress(TextColumn("{task.description}", markup=False), BarColumn(),
                        DownloadColumn(), TextColumn("{task.fields[state]}", markup=False),
                        console=err, transient=False)
    tasks: dict[str, int] = {}

    def report(lid: str, state: str, done: int, total: int) -> None:
        if lid not in tasks:
            tasks[lid] = progress.add_task(lid, total=total or None, state=state)
        progress.update(tasks[lid], completed=done, state=state)

    with progress:
        info = svc.pull_registry(ref, tag, auth, report)
    _print_image(info, as_json)
