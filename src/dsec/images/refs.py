"""Pure parsing of image references and digests (no I/O)."""

from __future__ import annotations

import re
import urllib.parse

from dsec.api.errors import InvalidArgument

__all__ = ["normalize_ref", "is_digest", "check_digest", "digest_hex", "layer_id", "tag_filename"]

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_NAME = re.compile(r"[a-z0-9][a-z0-9._\-/]{0,199}")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")


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
