"""Projects as the asynchronous SDK sees them: ``client.projects.create("team/run-17")``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsec.api.models import validated
from dsec.api.projects import (AuditEntry, ProjectAuditList, ProjectCreate, ProjectInfo,
                               ProjectList, ProjectUpdate, Quota, Role, TokenCreate,
                               TokenCreated, TokenInfo, TokenList, TokenRevoke, Usage)

from dsec.sdk.boundary import guarded, parse

if TYPE_CHECKING:
    from dsec.sdk.client import AsyncClient

__all__ = ["AsyncProjects"]


@guarded
class AsyncProjects:
    """Nested projects, their quotas and tokens. A token sees its own project and those
    below it; an admin token manages the projects below its own."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def create(self, project: str, quota: Quota | None = None) -> ProjectInfo:
        """A sub-project (its parent must exist) with a quota out of what the parent has
        not given to its other sub-projects."""
        req = validated(ProjectCreate, path=project, quota=quota or Quota())
        resp = await self._client._request("POST", "/v1/projects",
                                           json=req.model_dump(exclude_none=True))
        return parse(ProjectInfo, resp)

    async def list(self) -> list[ProjectInfo]:
        """This token's project and every project below it."""
        resp = await self._client._request("GET", "/v1/projects")
        return parse(ProjectList, resp).projects

    async def get(self, project: str) -> ProjectInfo:
        resp = await self._client._request("GET", "/v1/projects/info",
                                           params={"path": project})
        return parse(ProjectInfo, resp)

    async def usage(self, project: str) -> Usage:
        """What the project and all below it hold now."""
        return (await self.get(project)).usage

    async def set_quota(self, project: str, quota: Quota) -> ProjectInfo:
        body = validated(ProjectUpdate, quota=quota).model_dump(exclude_none=True)
        resp = await self._client._request("PUT", "/v1/projects/quota",
                                           params={"path": project},
                                           json=body)
        return parse(ProjectInfo, resp)

    async def delete(self, project: str) -> None:
        """Delete an empty project (no sub-projects, sandboxes, job leases or snapshots:
        Conflict naming what it still holds); its tokens stop."""
        await self._client._request("DELETE", "/v1/projects", params={"path": project})

    async def create_token(self, project: str, role: Role = "user",
                           ttl_s: float | None = 86400.0, name: str = "") -> str:
        """A new token of the project; the secret is returned this once."""
        return (await self.create_token_info(project, role, ttl_s, name)).token

    async def create_token_info(self, project: str, role: Role = "user",
                                ttl_s: float | None = 86400.0, name: str = "") -> TokenCreated:
        """Like :meth:`create_token`, with the token's id (what revoke_token takes)."""
        body = validated(TokenCreate, role=role, ttl_s=ttl_s, name=name).model_dump()
        resp = await self._client._request("POST", "/v1/projects/tokens",
                                           params={"path": project}, json=body)
        return parse(TokenCreated, resp)

    async def tokens(self, project: str) -> list[TokenInfo]:
        resp = await self._client._request("GET", "/v1/projects/tokens",
                                           params={"path": project})
        return parse(TokenList, resp).tokens

    async def revoke_token(self, token: str) -> None:
        """Revoke a token, given its id (``tok-...``) or its secret; at once, its open
        streams included."""
        body = validated(TokenRevoke, token=token).model_dump()
        await self._client._request("POST", "/v1/projects/tokens/revoke", json=body)

    async def audit(self, project: str = "", limit: int = 100,
                    since: float = 0.0) -> list[AuditEntry]:
        """Newest first: management calls and refused requests of the project and below."""
        resp = await self._client._request("GET", "/v1/projects/audit",
                                           params={"path": project, "limit": limit,
                                                   "since": since})
        return parse(ProjectAuditList, resp).entries
