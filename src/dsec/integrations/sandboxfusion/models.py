"""SandboxFusion's wire models, as its server and its ``sandbox-fusion`` client define them.

Field names, defaults and enum values follow SandboxFusion's ``sandbox/server/sandbox_api.py``
and ``sandbox/runners/types.py``; the language list is the client's (a superset of the
server's: it adds ``python2``, ``gtest`` and ``react``), plus ``c``, so a language the
client can send answers "not available" rather than a validation error.
"""

from __future__ import annotations

from enum import Enum
from typing import Literal, Optional

from pydantic import BaseModel, Field

__all__ = ["Language", "LANGUAGES", "RunCodeRequest", "RunCodeResponse", "CommandRunResult",
           "CommandRunStatus", "RunStatus"]

Language = Literal[
    "python", "python2", "cpp", "c", "nodejs", "go", "go_test", "java", "php", "csharp",
    "bash", "typescript", "sql", "rust", "cuda", "lua", "R", "perl", "D_ut", "ruby",
    "scala", "julia", "pytest", "junit", "kotlin_script", "jest", "verilog", "python_gpu",
    "lean", "swift", "racket", "gtest", "react"]
LANGUAGES: tuple[str, ...] = Language.__args__


class CommandRunStatus(str, Enum):
    Finished = "Finished"
    Error = "Error"
    TimeLimitExceeded = "TimeLimitExceeded"


class RunStatus(str, Enum):
    Success = "Success"          # every step exited 0
    Failed = "Failed"            # a step exited non-zero or ran out of time
    SandboxError = "SandboxError"  # the sandbox could not run the code; message says why


class CommandRunResult(BaseModel):
    """One step (compile or run)."""

    status: CommandRunStatus
    execution_time: Optional[float] = None
    return_code: Optional[int] = None
    stdout: Optional[str] = None
    stderr: Optional[str] = None


class RunCodeRequest(BaseModel):
    """``POST /run_code``: one program, compiled first for compiled languages."""

    compile_timeout: float = Field(10, gt=0, le=1800,
                                   description="compile timeout for compiled languages, s")
    run_timeout: float = Field(10, gt=0, le=1800, description="code run timeout, s")
    memory_limit_MB: int = Field(-1, description="maximum memory in MiB; -1: the default")
    code: str = Field(..., examples=['print("hello")'], description="the code to run")
    stdin: Optional[str] = Field(None, description="optional string to pass into stdin")
    language: Language = Field(..., examples=["python"],
                               description="the language or execution mode of the code")
    files: dict[str, Optional[str]] = Field(
        {}, description="a dict from file path to base64 encoded file content")
    fetch_files: list[str] = Field(
        [], description="a list of file paths to fetch after code execution")


class RunCodeResponse(BaseModel):
    status: RunStatus
    message: str
    compile_result: Optional[CommandRunResult] = None
    run_result: Optional[CommandRunResult] = None
    executor_pod_name: Optional[str] = None
    files: dict[str, str] = {}
