"""Project routes: sub-projects, their quotas and tokens, usage and the audit log.

Paths travel as the ``path`` query parameter (they hold ``/``). A token sees its own
project and those below it; an admin manages the projects strictly below its own (its
own quota is its parent's to set) and the tokens of its own and below. A project outside
the caller's is refused as Forbidden before it is looked up, so the answer says nothing
about whether it exists. Every call that changes something is audited, refused or not.
"""

from __future__ import annotations

import asyncio
from contextlib import contextmanager

from fastapi import APIRouter, Query, Request

from dsec.api.errors import Conflict, DSecError, Forbidden, InvalidArgument, NodeLost, NotFound
from dsec.api.projects import (ProjectAuditList, ProjectCreate, ProjectInfo, ProjectList,
                               ProjectUpdate, TokenCreate, TokenCreated, TokenList, TokenRevoke,
                               check_project_path, within)
from dsec.api.scope import caller_scope
from dsec.gateway.auth import principal_of
from dsec.gateway.routes.common import gateway_of
from dsec.gateway.spread import fan_out

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
    """An empty project: no sub-projects, sandboxes, job leases or snapshots (Conflict
    naming what it still holds). Its tokens stop working. What the nodes keep by project
    path must go first: a project made again at the path would otherwise take it over."""
    with _audited(request, path):
        path = _scope(request, path, below=True)
        gw = gateway_of(request)
        gw.projects.store.check_empty(path)  # what the store knows, before the nodes
        await _nothing_on_nodes(gw, path)
        gw.projects.store.delete(path)


async def _nothing_on_nodes(gw, path: str) -> None:
    """Conflict naming the job leases and snapshots the nodes keep for ``path`` (or a
    project below it); NodeLost if a node that may keep some does not answer."""
    mark = caller_scope.set(path)  # what a token of the project sees
    try:
        (jobs, down), (images, down_too) = await asyncio.gather(
            fan_out(gw, "jobs"), fan_out(gw, "list_images"))
    finally:
        caller_scope.reset(mark)
    unreachable = sorted({*down, *down_too})
    if unreachable:
        raise NodeLost(f"project {path!r} is not deleted: node(s) {', '.join(unreachable)} "
                       "do not answer, and may keep its job leases or snapshots; delete it "
                       "again when they are back")
    leases = sorted({j.job for part in jobs for j in part if j.lease_expires_at is not None})
    tags = sorted({i.name for part in images for i in part if i.project is not None})
    held = [f"the job lease of {j!r}" for j in leases] + [f"the snapshot {t!r}" for t in tags]
    if not held:
        return
    todo = []
    if leases:
        todo.append("stop those jobs (client.jobs.stop(job) with a token of the project; "
                    "one above it stops the job in every project below it)")
    if tags:
        todo.append("remove those snapshots (client.remove_image(tag) with an admin token "
                    "of the project or one above it)")
    shown = ", ".join(held[:5]) + (f" and {len(held) - 5} more" if len(held) > 5 else "")
    raise Conflict(f"project {path!r} holds {shown}; {' and '.join(todo)} first")


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
    """Newest first: management calls and refused requests of the project and below,
    since the project was made: a project made again at a path it had before does not
    read the earlier one's entries (the projects above it do)."""
    projects = gateway_of(request).projects
    path = _scope(request, path)
    if path:
        since = max(since, projects.store.created_at(path))
    return ProjectAuditList(entries=projects.audit.entries(path, limit, since))
