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
   (:mod:`dsec.images.pull`), then exported the same way and copied by skopeo into the
   build's own buildah store under a name of ours; buildah never touches a network.
3. Runs buildah with ``--network none`` (RUN steps see only loopback; a build granted
   named permissions of the node's ``network.json`` gets a namespace with exactly those,
   :mod:`dsec.node.host.buildnet`) in a private storage root under the store's ``tmp/``, writes the result as an OCI layout, and imports it; the
   base layers map back to the EROFS layers they came from, so only new layers are built.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import secrets
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dsec.api.errors import InvalidArgument, NotFound
from dsec.images.heredoc import CONTEXT, DEFAULT_SHELL, HEREDOC, Lowered, lower_instruction
from dsec.images.refs import normalize_ref

if TYPE_CHECKING:
    from dsec.images.models import ImageInfo
    from dsec.images.registry import RegistryAuth
    from dsec.images.service import ImageService

__all__ = ["Instruction", "parse_dockerfile", "check_context", "build_dockerfile",
           "DockerfileError", "escape_char"]

KNOWN = {"FROM", "RUN", "COPY", "ADD", "ENV", "WORKDIR", "USER", "ARG", "ENTRYPOINT", "CMD",
         "LABEL", "EXPOSE", "VOLUME", "SHELL", "STOPSIGNAL", "HEALTHCHECK", "ONBUILD",
         "MAINTAINER"}


class DockerfileError(InvalidArgument):
    """A Dockerfile dsec refuses to build, or a build that failed; names file and line."""


@dataclass(frozen=True)
class Instruction:
    """One instruction: its keyword (upper case), the rest of its first lines (continuations
    joined), the lines it spans (1-based, heredoc bodies included) and its heredoc bodies."""

    keyword: str
    args: str
    line: int
    end: int = 0
    heredocs: tuple[str, ...] = ()
    body: int = 0
    """Line (1-based) where the heredoc bodies start; ``end + 1`` when there are none."""


_DIRECTIVE = re.compile(r"^#\s*([a-zA-Z]+)\s*=\s*(\S*)\s*$")


def escape_char(text: str, where: str = "Dockerfile") -> str:
    """The ``# escape=`` parser directive of a Dockerfile (``\\`` by default).

    Directives are comment lines at the very top; the first other line ends them."""
    for raw in text.splitlines():
        m = _DIRECTIVE.match(raw.strip())
        if not m:
            break
        if m.group(1).lower() == "escape":
            if m.group(2) not in ("\\", "`"):
                raise DockerfileError(f"{where} line 1: escape={m.group(2)!r}: the escape "
                                      f"character must be a backslash or a backtick")
            return m.group(2)
    return "\\"


def _heredoc_body(lines: list[str], i: int, marks: list[tuple[str, str]], where: str,
                  start: int) -> tuple[list[str], int]:
    """The bodies of the heredocs ``marks`` opened by an instruction, from line index ``i``
    on; returns them and the index of the first line after the last terminator."""
    bodies = []
    for dash, word in marks:
        body = []
        while True:
            if i >= len(lines):
                raise DockerfileError(f"{where} line {start}: heredoc <<{word} is never "
                                      f"closed (no line {word!r} follows)")
            line = lines[i].lstrip("\t") if dash else lines[i]
            i += 1
            if line == word:
                break
            body.append(line)
        bodies.append("\n".join(body))
    return bodies, i


def parse_dockerfile(text: str, where: str = "Dockerfile") -> list[Instruction]:
    """Split a Dockerfile into instructions (continuations joined, comments dropped, heredoc
    bodies kept with their instruction); honours the ``# escape=`` directive.

    Raises DockerfileError for an unknown instruction, naming its line.
    """
    esc = escape_char(text, where)
    lines = text.splitlines()
    out: list[Instruction] = []
    pending, start, i = "", 0, 0
    while i < len(lines):
        no, line = i + 1, lines[i].strip()
        i += 1
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # comment lines inside a continued instruction are dropped
        if not pending:
            start = no
        if line.endswith(esc):
            pending += line[:-1] + " "
            continue
        full, pending = pending + line, ""
        keyword, _, args = full.partition(" ")
        kw = keyword.upper()
        if kw not in KNOWN:
            raise DockerfileError(f"{where} line {start}: unknown instruction {keyword!r}; "
                                  f"known: {', '.join(sorted(KNOWN))}")
        bodies: list[str] = []
        body = i + 1
        if kw in ("RUN", "COPY", "ADD"):
            marks = [(m.group(1), m.group(3)) for m in HEREDOC.finditer(args)]
            bodies, i = _heredoc_body(lines, i, marks, where, start)
        out.append(Instruction(kw, args.strip(), start, i, tuple(bodies), body))
    if pending:
        raise DockerfileError(f"{where} line {start}: the file ends inside a continued line")
    if not out or out[0].keyword not in ("FROM", "ARG"):
        raise DockerfileError(f"{where}: the first instruction must be FROM (or ARG)")
    return out


def _sources(inst: Instruction) -> list[str]:
    """The source paths of a COPY/ADD (flags and the destination dropped)."""
    args = inst.args
    if args.startswith("["):
        try:
            words = json.loads(args)
        except ValueError as exc:
            raise DockerfileError(f"line {inst.line}: {inst.keyword} JSON form is invalid") from exc
    else:
        words = shlex.split(args)
    words = [w for w in words if not w.startswith("--")]
    return [w for w in words[:-1] if not HEREDOC.fullmatch(w)]  # a heredoc is no path


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


def _storage(work: pathlib.Path) -> list[str]:
    """buildah's storage options: a vfs store of this build's own, under ``work``."""
    return ["--root", str(work / "root"), "--runroot", str(work / "run"),
            "--storage-driver", "vfs"]


def _base_image(svc: ImageService, image: str, work: pathlib.Path, auth: RegistryAuth | None,
                cache: dict[str, str]) -> str:
    """The name, in the build's own buildah store, of a FROM image: a dsec image, else
    pulled from its registry first.

    The image goes in by ``skopeo copy`` under a name of ours: buildah names an image read
    straight from ``oci:DIR`` after DIR, and a state directory's path is not always a valid
    image name (a ``_`` at the end of a component is refused)."""
    if image in cache:
        return cache[image]
    ref = normalize_ref(image)
    known = svc.store.get_tag(ref) is not None or ref == "busybox:latest"
    if ref == "busybox:latest":
        svc.ensure_busybox()
    if not known:  # not a dsec image: a registry's (Docker Hub's if it names no host)
        svc.pull_registry(image, auth=auth)
    layout, tag = work / f"base-{len(cache)}", ref.rsplit(":", 1)[1]
    name = f"localhost/dsec-base-{len(cache)}:{tag}"
    svc.export_oci(ref, layout, compress=False)
    try:
        _run(["skopeo", "copy", "--quiet", f"oci:{layout}:{tag}",
              f"containers-storage:[vfs@{work / 'root'}+{work / 'run'}]{name}"],
             f"FROM {image}", None)
    finally:
        shutil.rmtree(layout, ignore_errors=True)
    cache[image] = name
    return name


def _shells(instructions: list[Instruction]) -> dict[int, list[str]]:
    """The shell each RUN line runs under: SHELL's, else /bin/sh -c (reset at each FROM)."""
    out, shell = {}, DEFAULT_SHELL
    for inst in instructions:
        if inst.keyword == "FROM":
            shell = DEFAULT_SHELL
        elif inst.keyword == "SHELL":
            try:
                shell = json.loads(inst.args)
            except ValueError as exc:
                raise DockerfileError(f"line {inst.line}: SHELL takes a JSON array") from exc
        out[inst.line] = shell
    return out


def _from_line(svc: ImageService, inst: Instruction, stages: set[str], work: pathlib.Path,
               auth: RegistryAuth | None, cache: dict[str, str]) -> str:
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
        rest[0] = _base_image(svc, image, work, auth, cache)
    return " ".join(["FROM", *flags, *rest])


def _rewrite(svc: ImageService, text: str, instructions: list[Instruction],
             work: pathlib.Path, auth: RegistryAuth | None, heredocs: Lowered) -> str:
    """The Dockerfile with every external FROM pointing at a local OCI layout and every
    heredoc lowered (:mod:`dsec.images.heredoc`); every other line is kept as written."""
    stages, cache, shells = _stage_names(instructions), {}, _shells(instructions)
    lines = text.splitlines()
    for inst in reversed(instructions):  # from the end, so earlier line numbers hold
        if inst.keyword == "FROM":
            new = _from_line(svc, inst, stages, work, auth, cache)
        elif inst.heredocs:
            try:
                new = lower_instruction(inst.keyword, inst.args, inst.heredocs,
                                        lines[inst.body - 1:inst.end], shells[inst.line],
                                        inst.line, heredocs)
            except InvalidArgument as exc:
                raise DockerfileError(f"{exc}") from exc
        else:
            continue
        lines[inst.line - 1:inst.end] = [new]
    return "\n".join(lines) + "\n"


def build_dockerfile(svc: ImageService, dockerfile: pathlib.Path, tag: str,
                     context: pathlib.Path | None = None, build_args: dict[str, str] | None = None,
                     auth: RegistryAuth | None = None, log: pathlib.Path | None = None,
                     network: dict[str, bool] | None = None) -> ImageInfo:
    """Build ``dockerfile`` with buildah, import the result, tag it ``tag``.

    RUN steps see loopback only unless ``network`` grants named permissions of the node's
    ``network.json`` (as ``create(network=...)`` does): then they reach what a sandbox with
    those permissions reaches (:mod:`dsec.node.host.buildnet`)."""
    dockerfile = pathlib.Path(dockerfile)
    context = pathlib.Path(context or dockerfile.parent)
    if not dockerfile.is_file():
        raise NotFound(f"{dockerfile} does not exist")
    if not context.is_dir():
        raise NotFound(f"build context {context} is not a directory")
    tag = normalize_ref(tag)
    text = dockerfile.read_text()
    instructions = parse_dockerfile(text, str(dockerfile))
    check_context(instructions, context, str(dockerfile))
    if shutil.which("buildah") is None:
        raise NotFound("buildah is not installed on this node (apt-get install buildah)")
    work = svc.store.tempdir("dockerfile-")
    try:
        heredocs = Lowered()
        (work / "Dockerfile").write_text(_rewrite(svc, text, instructions, work, auth,
                                                  heredocs))
        storage = _storage(work)
        # mkdtemp's suffix may hold '_' runs, which image names refuse: a hex name instead
        name = f"localhost/dsec-build-{secrets.token_hex(6)}"
        cmd = ["buildah", *storage, "bud", "--layers=false", "--pull-never",
               "-f", str(work / "Dockerfile"), "-t", name]
        for k, v in (build_args or {}).items():
            cmd += ["--build-arg", f"{k}={v}"]
        if heredocs.files:
            cmd += ["--build-context", f"{CONTEXT}={_write_files(work / CONTEXT, heredocs)}"]
        with _run_network(svc, network or {}) as net_args:
            _buildah([*cmd, *net_args, str(context)], dockerfile, log)
        _buildah(["buildah", *storage, "push", "--quiet", "--disable-compression", name,
                  f"oci:{work / 'out'}:{tag.rsplit(':', 1)[1]}"], dockerfile, log)
        return svc.import_image(work / "out", tag)
    finally:
        subprocess.run(["buildah", *_storage(work), "rm", "--all"], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


def _write_files(root: pathlib.Path, heredocs: Lowered) -> pathlib.Path:
    for name, content in heredocs.files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(content)
        (root / name).chmod(0o644)
    return root


@contextlib.contextmanager
def _run_network(svc: ImageService, allow: dict[str, bool]) -> Iterator[list[str]]:
    """buildah's network arguments for RUN steps: none, or a namespace with ``allow``."""
    if not allow:
        yield ["--network", "none"]
        return
    from dsec.node.host.buildnet import build_network  # host networking: only when asked

    with build_network(svc.root.parent, allow) as net:
        yield net.buildah_args()


def _buildah(cmd: list[str], dockerfile: pathlib.Path, log: pathlib.Path | None) -> None:
    _run(cmd, str(dockerfile), log)


def _run(cmd: list[str], what: str, log: pathlib.Path | None) -> None:
    """Run a buildah or skopeo step of the build; its output goes to ``log``."""
    res = subprocess.run(cmd, capture_output=True, text=True)
    if log is not None:
        with open(log, "a") as f:
            f.write(res.stdout + res.stderr)
    if res.returncode != 0:
        tail = (res.stderr.strip() or res.stdout.strip())[-1500:]
        raise DockerfileError(f"building {what} failed ({cmd[0]} exit {res.returncode}):"
                              f"\n{tail}")
