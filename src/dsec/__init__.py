"""dsec: elastic sandboxes for agentic RL and LLM agent evaluation.

    import dsec
    async with dsec.AsyncClient() as client:
        sb = await client.create(backend="container", image="busybox")
        r = await sb.exec("echo hello")
"""

from dsec.api.errors import (Capacity, Conflict, DSecError, Forbidden, Internal,
                             InvalidArgument, NodeLost, NotFound, QuotaExceeded,
                             SandboxStopped, SandboxTimeout,
                             TrajectoryDiverged, RemoteError, Unauthorized, Unavailable,
                             Unsupported)
from dsec.api.fncall import FnCallResult
from dsec.api.projects import Quota
from dsec.api.models import ExecEvent, ExecResult, FileInfo, SandboxInfo, SandboxSpec
from dsec.api.process import ProcessInfo
from dsec.sdk import (AsyncClient, AsyncProcess, AsyncPty, AsyncSandbox, AsyncShell, Client,
                      Process, Pty, Sandbox, Shell)

__version__ = "0.1.0"

__all__ = [
    "AsyncClient", "Client", "AsyncSandbox", "Sandbox", "AsyncShell", "Shell",
    "AsyncProcess", "Process", "AsyncPty", "Pty",
    "SandboxSpec", "SandboxInfo", "ExecResult", "ExecEvent", "FileInfo", "FnCallResult",
    "ProcessInfo", "Quota",
    "DSecError", "NotFound", "InvalidArgument", "Unauthorized", "Forbidden", "Capacity",
    "QuotaExceeded", "SandboxTimeout",
    "SandboxStopped", "Unsupported", "Conflict", "TrajectoryDiverged", "Unavailable",
    "NodeLost", "RemoteError", "Internal",
]
