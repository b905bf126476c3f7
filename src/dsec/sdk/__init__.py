"""The dsec SDK: :class:`AsyncClient` and its blocking face :class:`Client`."""

from dsec.sdk.client import AsyncClient
from dsec.sdk.sandbox import AsyncFiles, AsyncSandbox, AsyncShell
from dsec.sdk.sync import Client, Files, Sandbox, Shell

__all__ = ["AsyncClient", "AsyncSandbox", "AsyncShell", "AsyncFiles", "Client", "Sandbox",
           "Shell", "Files"]
