"""Which role a request needs, from its method and path alone. Pure.

``viewer`` reads; ``user`` also creates and uses sandboxes, runs fncalls and job verbs;
``grader`` also runs the grading step (``grading=True`` on an exec, an exec stream or a
background process), the one command that reaches a sandbox's protected paths, so an agent
holding a user token cannot read its own hidden tests; ``admin`` also manages sub-projects,
their quotas and tokens, and reads the audit log (it may mint a grader token, so it may
grade too).
Changing the node's images (push, remove) is for an admin of the root project: images are
shared by every project. A project's snapshot (``pack_diff`` with its token) is its own:
an admin of that project or one above it removes it.
"""

from __future__ import annotations

from dsec.api.projects import ROLES, Role

__all__ = ["needed", "allows", "may_grade", "ROOT_ONLY", "GRADER"]

ROOT_ONLY = "root-admin"
GRADER: Role = "grader"
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
    if method == "DELETE" and path.startswith("/v1/images/"):
        return "admin"  # its projects' snapshots only: the node refuses a shared image
    if path.startswith(("/v1/images", "/v1/blobs", "/v1/manifests")):
        return ROOT_ONLY
    return "user"


def allows(role: Role, project: str, need: Role | str) -> bool:
    """Whether a token of ``role`` in ``project`` may do what needs ``need``."""
    if need == ROOT_ONLY:
        return role == "admin" and project == ""
    return ROLES.index(role) >= ROLES.index(need)  # type: ignore[arg-type]


def may_grade(role: Role) -> bool:
    """Whether a token of ``role`` may run the grading step."""
    return ROLES.index(role) >= ROLES.index(GRADER)
