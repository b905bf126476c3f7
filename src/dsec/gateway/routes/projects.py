"""Project routes: sub-projects, their quotas and tokens, usage and the audit log.

Paths travel as the ``path`` query parameter (they hold ``/``). A token sees its own
project and those below it; an admin manages the projects strictly below its own (its
own quota is its parent's to set) and the tokens of its own and below. A project outside
the caller's is refused as Forbidden before it is looked up, so the answer says nothing
about whether it exists. Every call that changes something is audited, refused or not.
"""

from __future__ import annotations

from contextlib import contextmanager

from fastapi import APIRouter, Query, Request

from dsec.api.errors import DSecError, Forbidden, InvalidArgument, NotFound
from dsec.api.projects import (ProjectAuditList, ProjectCreate, ProjectInfo, ProjectList,
                               ProjectUpdate, TokenCreate, TokenCreated, TokenList, TokenRevoke,
                               check_project_path, within)
from dsec.gateway.auth import principal_of
from dsec.gateway.routes.common import gateway_of

__all__ = ["router"]

router = APIRouter(prefix="/v1/projects")
PathQuery = Query("", max_length=1100, description="a project path; '' is the root")


def _checked(path: str) -> str:
    try:
        return check_project_path(path, "path")
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None


def _scope(request: Request, path: str, below: bool = False) -> str:
    """``path`` if the caller may reach it (with ``below``, only strictly below its own)."""
    who = principal_of(request)
    path = _checked(path)
    mine = who.project
    if not within(path, mine) or (below and path == mine):
        where = "below" if below else "at or below"
        raise Forbidden(f"project {path!r} is not {where} this token's project "
                        f"{mine or '(root)'!r}")
    return path


@contextmanager
def _audited(request: Request, path: str, target: str = ""):
    projects = gateway_of(request).projects
    who = principal_of(request)
    action = f"{request.method} {request.url.path}"
    try:
        yield
    except DSecError as exc:  # kept in the caller's log: a refusal touches no other's
        projects.audit.record(who.project, who.who, action, f"{path} {target}".strip(),
                              f"{exc.code}: {exc.message}")
        raise
    projects.audit.record(path, who.who, action, target, "ok")


@router.post("", response_model=ProjectInfo, status_code=201)
async def create(request: Request, req: ProjectCreate) -> ProjectInfo:
    """A sub-project, with a quota out of what its parent has not given away."""
    with _audited(request, req.path, req.quota.model_dump_json(exclude_none=True)):
        _scope(request, req.path, below=True)
        return gateway_of(request).projects.store.create(req.path, req.quota)


@router.get("", response_model=ProjectList)
async def list_projects(request: Request) -> ProjectList:
    """The caller's project and every one below it, with quotas and rolled-up usage."""
    return ProjectList(projects=gateway_of(request).projects.store.list(
        principal_of(request).project))


@router.get("/info", response_model=ProjectInfo)
async def info(request: Request, path: str = PathQuery) -> ProjectInfo:
    """One project: quota, what it gave its sub-projects, and usage rolled up over them."""
    return gateway_of(request).projects.store.info(_scope(request, path))


@router.put("/quota", response_model=ProjectInfo)
async def set_quota(request: Request, req: ProjectUpdate, path: str = PathQuery
                    ) -> ProjectInfo:
    """A sub-project's new quota: within what its parent has left, and no less than its
    own sub-projects were given."""
    with _audited(request, path, req.quota.model_dump_json(exclude_none=True)):
        return gateway_of(request).projects.store.set_quota(
            _scope(request, path, below=True), req.quota)


@router.delete("", status_code=204)
async def delete(request: Request, path: str = PathQuery) -> None:
    """An empty project: no sub-projects, no sandboxes. Its tokens stop working."""
    with _audited(request, path):
        gateway_of(request).projects.store.delete(_scope(request, path, below=True))


@router.post("/tokens", response_model=TokenCreated, status_code=201)
async def create_token(request: Request, req: TokenCreate, path: str = PathQuery
                       ) -> TokenCreated:
    """A token of the project; the secret is in this answer only. It is no higher than
    the caller's role and expires no later than the caller's token (a longer ``ttl_s`` is
    400 naming the limit; none takes the caller's expiry)."""
    with _audited(request, path, f"role={req.role}"):
        made = gateway_of(request).projects.store.create_token(
            _scope(request, path), req.role, req.ttl_s, req.name, by=principal_of(request))
    return made


@router.get("/tokens", response_model=TokenList)
async def tokens(request: Request, path: str = PathQuery) -> TokenList:
    """The project's tokens (never their secrets)."""
    return TokenList(tokens=gateway_of(request).projects.store.tokens(_scope(request, path)))


@router.post("/tokens/revoke", status_code=204)
async def revoke_token(request: Request, req: TokenRevoke) -> None:
    """Revoke at once, by id or secret: requests with it are refused, its streams end. A
    token of a project outside the caller's is not found, as a token that does not exist
    (the answer says nothing of it, nor of its project); a secret is never logged."""
    store = gateway_of(request).projects.store
    mine = principal_of(request).project
    named = req.token[:16] if req.token.startswith("tok-") else "with that secret"
    try:
        tok = store.token(req.token)
    except NotFound:
        tok = None
    if tok is not None and not within(tok.project, mine):
        tok = None
    with _audited(request, mine, tok.id if tok is not None else f"token {named}"):
        if tok is None:
            raise NotFound(f"token {named} not found")
        store.revoke_token(tok.id)


@router.get("/audit", response_model=ProjectAuditList)
async def audit(request: Request, path: str = PathQuery,
                limit: int = Query(100, ge=1, le=10_000),
                since: float = Query(0.0, ge=0)) -> ProjectAuditList:
    """Newest first: management calls and refused requests of the project and below."""
    return ProjectAuditList(entries=gateway_of(request).projects.audit.entries(
        _scope(request, path), limit, since))
