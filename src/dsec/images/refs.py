"""Pure parsing of image references and digests (no I/O)."""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass

from dsec.api.errors import Conflict, InvalidArgument
from dsec.api.projects import within

__all__ = ["normalize_ref", "is_digest", "check_digest", "digest_hex", "layer_id", "tag_filename",
           "RegistryRef", "parse_registry_ref", "has_registry_host", "check_tag_owner"]

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
# An optional registry host[:port]/ prefix, then the repository path.
_HOST = r"(?:[a-z0-9][a-z0-9.\-]*(?::[0-9]{1,5})?/)"
_NAME = re.compile(_HOST + r"?[a-z0-9][a-z0-9._\-/]{0,199}")
DOCKER_HUB = "registry-1.docker.io"
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")


def check_tag_owner(name: str, owner: str | None, project: str) -> None:
    """Conflict when a snapshot of ``project`` may not take tag ``name``, held by a
    snapshot of ``owner`` (None: a shared image): only its own project's, or one below
    it, may be replaced. It says the same whether the tag is shared or another
    project's (which the caller cannot see)."""
    if owner is None or not within(owner, project):
        raise Conflict(f"tag {name!r} is taken: a project's snapshot makes a new tag or "
                       "replaces one of its own project's snapshots, never a shared "
                       "image's or another project's; choose another tag (e.g. one "
                       "named after the project)")


def is_digest(ref: str) -> bool:
    """True if ``ref`` is a 'sha256:<64 hex>' digest."""
    return bool(_DIGEST.fullmatch(ref))


def check_digest(digest: str) -> str:
    """Return ``digest`` if well formed, else raise InvalidArgument."""
    if not is_digest(digest):
        raise InvalidArgument(f"digest must look like 'sha256:<64 lowercase hex>'; got {digest!r}")
    return digest


def digest_hex(digest: str) -> str:
    """The 64 hex digits of a digest."""
    return check_digest(digest).split(":", 1)[1]


def layer_id(digest: str) -> str:
    """Short id printed in logs: 'lyr-' and 12 hex digits."""
    return "lyr-" + digest_hex(digest)[:12]


def normalize_ref(ref: str) -> str:
    """'busybox' -> 'busybox:latest'; 'a/b:v1' unchanged; digests unchanged.

    A name may start with a registry host and port: '127.0.0.1:5000/team/env:v3'.

    Raises InvalidArgument for a name or tag with characters outside the allowed sets.
    """
    if is_digest(ref):
        return ref
    name, sep, tag = ref.rpartition(":")
    if not sep or "/" in tag:
        name, tag = ref, "latest"
    if not _NAME.fullmatch(name) or ".." in name or name.endswith("/") or "//" in name:
        raise InvalidArgument(
            f"image name must be lowercase letters, digits, '._-/' (e.g. 'workspace/repo:v1'); got {ref!r}")
    if not _TAG.fullmatch(tag):
        raise InvalidArgument(f"image tag must be letters, digits, '_.-'; got {tag!r} in {ref!r}")
    return f"{name}:{tag}"


def tag_filename(ref: str) -> str:
    """The file name a normalized tag is stored under (one flat directory)."""
    return urllib.parse.quote(ref, safe="") + ".json"


@dataclass(frozen=True)
class RegistryRef:
    """A reference to an image in an OCI distribution registry."""

    registry: str
    """Host[:port] to talk to ('registry-1.docker.io' for Docker Hub names)."""
    repository: str
    """Repository path ('library/busybox', 'team/env')."""
    reference: str
    """Tag or 'sha256:...' digest to fetch."""
    local: str
    """The name:tag the image gets in the local store."""

    @property
    def by_digest(self) -> bool:
        """True if the reference pins a manifest digest."""
        return is_digest(self.reference)


def has_registry_host(ref: str) -> bool:
    """True if the first path component of ``ref`` names a registry host.

    Docker's rule: a component with a '.' or ':' or exactly 'localhost' is a host.
    """
    first, sep, _ = ref.partition("/")
    return bool(sep) and ("." in first or ":" in first or first == "localhost")


def parse_registry_ref(ref: str) -> RegistryRef:
    """Split 'host:port/repo:tag', 'repo@sha256:...' or 'busybox' into its parts.

    Names without a host are Docker Hub's ('busybox' -> library/busybox). Pure; raises
    InvalidArgument for names :func:`normalize_ref` refuses.
    """
    name, at, digest = ref.partition("@")
    if at:
        check_digest(digest)
        tagged = ":" in name.rsplit("/", 1)[-1]
        local = normalize_ref(name if tagged else f"{name}:sha256-{digest_hex(digest)[:12]}")
    else:
        local = normalize_ref(name)
        if is_digest(local):
            raise InvalidArgument(f"{ref!r} is a bare digest; name the repository "
                                  f"('repo@sha256:...')")
    path, tag = local.rsplit(":", 1)
    if has_registry_host(path):
        registry, repository = path.split("/", 1)
    else:
        registry, repository = DOCKER_HUB, path if "/" in path else "library/" + path
    if registry in ("docker.io", "index.docker.io"):
        registry = DOCKER_HUB
    return RegistryRef(registry=registry, repository=repository,
                       reference=digest if at else tag, local=local)
