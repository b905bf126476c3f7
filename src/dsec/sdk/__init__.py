"""The dsec SDK: :class:`AsyncClient` and its blocking face :class:`Client`."""

from dsec.sdk.client import AsyncClient
from dsec.sdk.process import AsyncProcess
from dsec.sdk.pty import AsyncPty
from dsec.sdk.sandbox import AsyncFiles, AsyncSandbox, AsyncShell
from dsec.sdk.sync import Client, Files, Process, Pty, Sandbox, Shell

__all__ = ["AsyncClient", "AsyncSandbox", "AsyncShell", "AsyncFiles", "AsyncProcess",
           "AsyncPty", "Client", "Sandbox", "Shell", "Files", "Process", "Pty"]
