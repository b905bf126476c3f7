"""Which role a request needs, from its method and path alone. Pure.

``viewer`` reads; ``user`` also creates and uses sandboxes, runs fncalls and job verbs;
``admin`` also manages sub-projects, their quotas and tokens, and reads the audit log.
Changing the node's images (push, remove) is for an admin of the root project: images are
shared by every project.
"""

from __future__ import annotations

from dsec.api.projects import ROLES, Role

__all__ = ["needed", "allows", "ROOT_ONLY"]

ROOT_ONLY = "root-admin"
_READ = frozenset({"GET", "HEAD", "OPTIONS"})


def needed(method: str, path: str) -> Role | str:
    """The least role that may make this request (or :data:`ROOT_ONLY`)."""
    if path.startswith("/v1/projects"):
        if method in _READ and not (path.endswith("/tokens") or path.startswith(
                "/v1/projects/audit")):
            return "viewer"
        return "admin"
    if method in _READ:
        return "viewer"
    if path.startswith(("/v1/images", "/v1/blobs", "/v1/manifests")):
        return ROOT_ONLY
    return "user"


def allows(role: Role, project: str, need: Role | str) -> bool:
    """Whether a token of ``role`` in ``project`` may do what needs ``need``."""
    if need == ROOT_ONLY:
        return role == "admin" and project == ""
    return ROLES.index(role) >= ROLES.index(need)  # type: ignore[arg-type]
