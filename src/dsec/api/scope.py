"""Which project's sandboxes the current request may see, for the node to enforce.

The gateway authenticates a request and sets :data:`caller_scope` to its token's project
for the rest of that request; the node agent reads it when it looks a sandbox up, so a
sandbox of another project answers ``NotFound`` exactly as a missing one does, and lists
and job verbs only cover the caller's projects. Over HTTP the gateway sends the scope as
the :data:`SCOPE_HEADER` header, which a node believes only from a holder of the cluster
credential. Unset (the node's own housekeeping, the root token) means every project.
"""

from __future__ import annotations

from contextvars import ContextVar

from dsec.api.projects import within

__all__ = ["caller_scope", "visible", "SCOPE_HEADER"]

SCOPE_HEADER = "x-dsec-project"
caller_scope: ContextVar[str | None] = ContextVar("dsec_caller_scope", default=None)


def visible(project: str | None) -> bool:
    """Whether a sandbox of ``project`` (None: made before projects, the root's) is in the
    current request's scope."""
    scope = caller_scope.get()
    return scope is None or within(project or "", scope)
