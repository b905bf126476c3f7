"""SWE-ReX's ``AbstractDeployment`` on dsec: ``start()`` creates a sandbox, ``stop()`` ends it.

    from dsec.integrations.swerex import DsecDeployment
    d = DsecDeployment(image="python:3.11", url="http://127.0.0.1:7070", token="dsec_...")
    await d.start()
    await d.runtime.create_session(CreateBashSessionRequest())
    await d.runtime.run_in_session(BashAction(command="echo hi"))
    await d.stop()
"""

from __future__ import annotations

import logging
from typing import Any

from swerex.deployment.abstract import AbstractDeployment
from swerex.deployment.hooks.abstract import CombinedDeploymentHook, DeploymentHook
from swerex.exceptions import DeploymentNotStartedError
from swerex.runtime.abstract import IsAliveResponse

import dsec
from dsec.api.errors import NotFound
from dsec.integrations.swerex.runtime import DsecRuntime

__all__ = ["DsecDeployment"]


class DsecDeployment(AbstractDeployment):
    """One dsec sandbox of ``image`` per deployment. ``url``/``token`` default to the SDK's
    (``DSEC_URL``/``DSEC_TOKEN``, else the local server); ``create`` holds any other
    argument of ``AsyncClient.create`` (``backend``, ``memory_mb``, ``network``, ...)."""

    def __init__(self, image: str = "python:3.11", url: str | None = None,
                 token: str | None = None, *, logger: logging.Logger | None = None,
                 **create: Any) -> None:
        self.image = image
        self.url = url
        self.token = token
        self.create_args = {"memory_mb": 1024, "ttl_s": 6 * 3600, **create}
        self.logger = logger or logging.getLogger("dsec.integrations.swerex")
        self._hooks = CombinedDeploymentHook()
        self._client: dsec.AsyncClient | None = None
        self._sandbox = None
        self._runtime: DsecRuntime | None = None

    def add_hook(self, hook: DeploymentHook) -> None:
        self._hooks.add_hook(hook)

    @property
    def sandbox_id(self) -> str | None:
        return self._sandbox.id if self._sandbox is not None else None

    async def start(self) -> None:
        """Create the sandbox (and a client for it)."""
        if self._runtime is not None:
            return
        self._client = dsec.AsyncClient(self.url, self.token)
        self._hooks.on_custom_step(f"Creating a dsec sandbox of {self.image}")
        self._sandbox = await self._client.create(image=self.image, **self.create_args)
        self._runtime = DsecRuntime(self._sandbox, logger=self.logger)

    async def stop(self) -> None:
        """Close the sessions and stop the sandbox; a second call does nothing."""
        runtime, sandbox, client = self._runtime, self._sandbox, self._client
        self._runtime = self._sandbox = self._client = None
        if runtime is not None:
            await runtime.close()
        if sandbox is not None:
            try:
                await sandbox.stop()
            except NotFound:
                pass
        if client is not None:
            await client.close()

    async def is_alive(self, *, timeout: float | None = None) -> IsAliveResponse:
        return await self.runtime.is_alive(timeout=timeout)

    @property
    def runtime(self) -> DsecRuntime:
        if self._runtime is None:
            raise DeploymentNotStartedError()
        return self._runtime
