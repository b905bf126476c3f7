"""``dsec image build path/Dockerfile``: Dockerfiles built by ``buildah bud``, imported as layers.

Why buildah rather than an interpreter of our own: it is a well-kept Debian package that
implements the whole Dockerfile language (multi-stage builds, ARG scoping, COPY --from,
ADD of tars, .dockerignore) exactly as Docker does. dsec does three things around it:

1. Checks the file first, so mistakes get a specific error naming the line: an unknown
   instruction, a COPY/ADD source outside the build context (``..``, an absolute path
   climbing out, or a symlink in the context pointing out), ADD of a URL (RUN has no
   network, and neither does the build).
2. Resolves every ``FROM``: a dsec image is exported as an OCI layout (uncompressed tars,
   recorded in the layer map); anything else is pulled by dsec from its registry first
   (:mod:`dsec.images.pull`), then exported the same way. buildah gets ``FROM oci:DIR``
   and never touches a network.
3. Runs buildah with ``--network none`` (RUN steps see only loopback) in a private storage
   root under the store's ``tmp/``, writes the result as an OCI layout, and imports it; the
   base layers map back to the EROFS layers they came from, so only new layers are built.
"""

from __future__ import annotations

import os
import pathlib
import re
import secrets
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dsec.api.errors import InvalidArgument, NotFound
from dsec.images.refs import normalize_ref

if TYPE_CHECKING:
    from dsec.images.models import ImageInfo
    from dsec.images.registry import RegistryAuth
    from dsec.images.service import ImageService

__all__ = ["Instruction", "parse_dockerfile", "check_context", "build_dockerfile",
           "DockerfileError"]

KNOWN = {"FROM", "RUN", "COPY", "ADD", "ENV", "WORKDIR", "USER", "ARG", "ENTRYPOINT", "CMD",
         "LABEL", "EXPOSE", "VOLUME", "SHELL", "STOPSIGNAL", "HEALTHCHECK", "ONBUILD",
         "MAINTAINER"}


class DockerfileError(InvalidArgument):
    """A Dockerfile dsec refuses to build, or a build that failed; names file and line."""


@dataclass(frozen=True)
class Instruction:
    """One instruction: its keyword (upper case), the rest of the line, where it starts."""

    keyword: str
    args: str
    line: int


def parse_dockerfile(text: str, where: str = "Dockerfile") -> list[Instruction]:
    """Split a Dockerfile into instructions (continuations joined, comments dropped).

    Raises DockerfileError for an unknown instruction, naming its line.
    """
    out: list[Instruction] = []
    pending, start = "", 0
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # comment lines inside a continued instruction are dropped
        if not pending:
            start = no
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full, pending = pending + line, ""
        keyword, _, args = full.partition(" ")
        kw = keyword.upper()
        if kw not in KNOWN:
            raise DockerfileError(f"{where} line {start}: unknown instruction {keyword!r}; "
                                  f"known: {', '.join(sorted(KNOWN))}")
        out.append(Instruction(kw, args.strip(), start))
    if pending:
        raise DockerfileError(f"{where} line {start}: the file ends inside a continued line")
    if not out or out[0].keyword not in ("FROM", "ARG"):
        raise DockerfileError(f"{where}: the first instruction must be FROM (or ARG)")
    return out


def _sources(inst: Instruction) -> list[str]:
    """The source paths of a COPY/ADD (flags and the destination dropped)."""
    args = inst.args
    if args.startswith("["):
        import json

        try:
            words = json.loads(args)
        except ValueError as exc:
            raise DockerfileError(f"line {inst.line}: {inst.keyword} JSON form is invalid") from exc
    else:
        words = shlex.split(args)
    words = [w for w in words if not w.startswith("--")]
    return words[:-1]


def check_context(instructions: list[Instruction], context: pathlib.Path,
                  where: str = "Dockerfile") -> None:
    """Refuse COPY/ADD sources outside ``context`` and ADD of URLs (names the line)."""
    root = context.resolve()
    for inst in instructions:
        if inst.keyword not in ("COPY", "ADD") or re.search(r"--from[= ]", inst.args):
            continue
        for src in _sources(inst):
            if re.match(r"^[a-z]+://", src) or src.startswith("git@"):
                raise DockerfileError(f"{where} line {inst.line}: {inst.keyword} {src}: the "
                                      f"build has no network; put the file in the context")
            plain = re.split(r"[*?\[]", src, maxsplit=1)[0]
            path = (root / plain.lstrip("/")).resolve() if plain else root
            if os.path.normpath(src.lstrip("/")).startswith("..") or not (
                    path == root or root in path.parents):
                raise DockerfileError(
                    f"{where} line {inst.line}: {inst.keyword} {src}: the source is outside "
                    f"the build context {context} (it resolves to {path}); only files under "
                    f"the context can be copied")


def _stage_names(instructions: list[Instruction]) -> set[str]:
    names = set()
    for inst in instructions:
        if inst.keyword == "FROM":
            words = inst.args.split()
            if len(words) >= 3 and words[-2].upper() == "AS":
                names.add(words[-1].lower())
    return names


def _base_layout(svc: ImageService, image: str, work: pathlib.Path, auth: RegistryAuth | None,
                 cache: dict[str, str]) -> str:
    """``oci:DIR:tag`` for a FROM image: a dsec image, else pulled from its registry first."""
    if image in cache:
        return cache[image]
    ref = normalize_ref(image)
    known = svc.store.get_tag(ref) is not None or ref == "busybox:latest"
    if ref == "busybox:latest":
        svc.ensure_busybox()
    if not known:  # not a dsec image: a registry's (Docker Hub's if it names no host)
        svc.pull_registry(image, auth=auth)
    layout = work / f"base-{len(cache)}"
    svc.export_oci(ref, layout, compress=False)
    cache[image] = f"oci:{layout}:{ref.rsplit(':', 1)[1]}"
    return cache[image]


def _rewrite(svc: ImageService, instructions: list[Instruction], work: pathlib.Path,
             auth: RegistryAuth | None) -> str:
    """The Dockerfile with every external FROM pointing at a local OCI layout."""
    stages, cache, lines = _stage_names(instructions), {}, []
    for inst in instructions:
        if inst.keyword == "FROM":
            words = inst.args.split()
            flags = [w for w in words if w.startswith("--")]
            rest = [w for w in words if not w.startswith("--")]
            if any(f.startswith("--platform") for f in flags):
                flags = []  # one platform here: linux/amd64
            image = rest[0] if rest else ""
            if "$" in image:
                raise DockerfileError(f"line {inst.line}: FROM {image}: build arguments in "
                                      f"FROM are not supported; write the image name")
            if image.lower() not in stages and image != "scratch":
                rest[0] = _base_layout(svc, image, work, auth, cache)
            lines.append(" ".join(["FROM", *flags, *rest]))
        else:
            lines.append(f"{inst.keyword} {inst.args}")
    return "\n".join(lines) + "\n"


def build_dockerfile(svc: ImageService, dockerfile: pathlib.Path, tag: str,
                     context: pathlib.Path | None = None, build_args: dict[str, str] | None = None,
                     auth: RegistryAuth | None = None, log: pathlib.Path | None = None
                     ) -> ImageInfo:
    """Build ``dockerfile`` with buildah (no network), import the result, tag it ``tag``."""
    dockerfile = pathlib.Path(dockerfile)
    context = pathlib.Path(context or dockerfile.parent)
    if not dockerfile.is_file():
        raise NotFound(f"{dockerfile} does not exist")
    if not context.is_dir():
        raise NotFound(f"build context {context} is not a directory")
    tag = normalize_ref(tag)
    instructions = parse_dockerfile(dockerfile.read_text(), str(dockerfile))
    check_context(instructions, context, str(dockerfile))
    if shutil.which("buildah") is None:
        raise NotFound("buildah is not installed on this node (apt-get install buildah)")
    work = svc.store.tempdir("dockerfile-")
    try:
        (work / "Dockerfile").write_text(_rewrite(svc, instructions, work, auth))
        storage = ["--root", str(work / "root"), "--runroot", str(work / "run"),
                   "--storage-driver", "vfs"]
        # mkdtemp's suffix may hold '_' runs, which image names refuse: a hex name instead
        name = f"localhost/dsec-build-{secrets.token_hex(6)}"
        cmd = ["buildah", *storage, "bud", "--network", "none", "--layers=false",
               "--pull-never", "-f", str(work / "Dockerfile"), "-t", name]
        for k, v in (build_args or {}).items():
            cmd += ["--build-arg", f"{k}={v}"]
        _buildah([*cmd, str(context)], dockerfile, log)
        _buildah(["buildah", *storage, "push", "--quiet", "--disable-compression", name,
                  f"oci:{work / 'out'}:{tag.rsplit(':', 1)[1]}"], dockerfile, log)
        return svc.import_image(work / "out", tag)
    finally:
        subprocess.run(["buildah", "--root", str(work / "root"), "--runroot", str(work / "run"),
                        "--storage-driver", "vfs", "rm", "--all"], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


def _buildah(cmd: list[str], dockerfile: pathlib.Path, log: pathlib.Path | None) -> None:
    res = subprocess.run(cmd, capture_output=True, text=True)
    if log is not None:
        with open(log, "a") as f:
            f.write(res.stdout + res.stderr)
    if res.returncode != 0:
        tail = (res.stderr.strip() or res.stdout.strip())[-1500:]
        raise DockerfileError(f"building {dockerfile} failed (buildah exit {res.returncode}):"
                              f"\n{tail}")
