"""SWE-ReX's ``AbstractRuntime`` on a dsec sandbox: sessions on dsec shells, commands on
exec, files on the files API. Nothing of SWE-ReX runs in the sandbox (no Python needed)."""

from __future__ import annotations

import logging
import shlex
from pathlib import Path, PurePosixPath

from swerex.exceptions import (BashIncorrectSyntaxError, CommandTimeoutError,
                               NonZeroExitCodeError, SessionDoesNotExistError,
                               SessionExistsError)
from swerex.runtime.abstract import (AbstractRuntime, Action, BashAction, BashInterruptAction,
                                     BashObservation, CloseBashSessionResponse, CloseResponse,
                                     CloseSessionRequest, CloseSessionResponse, Command,
                                     CommandResponse, CreateBashSessionResponse,
                                     CreateSessionRequest, CreateSessionResponse,
                                     IsAliveResponse, Observation, ReadFileRequest,
                                     ReadFileResponse, UploadRequest, UploadResponse,
                                     WriteFileRequest, WriteFileResponse)

from dsec.api.errors import DSecError, NotFound, Unsupported
from dsec.integrations.swerex.session import SYNTAX_MARK, bash_line, init_line, sh_line
from dsec.sdk.sandbox import AsyncSandbox, AsyncShell

__all__ = ["DsecRuntime"]

MAX_OUTPUT = 8 << 20  # what the node keeps of a command's output at most


class DsecRuntime(AbstractRuntime):
    """The runtime of one dsec sandbox. Sessions map SWE-ReX session names to dsec shells."""

    def __init__(self, sandbox: AsyncSandbox, *, logger: logging.Logger | None = None) -> None:
        self.sandbox = sandbox
        self.logger = logger or logging.getLogger("dsec.integrations.swerex")
        self._shells: dict[str, AsyncShell] = {}
        self._bash: bool | None = None

    async def _has_bash(self) -> bool:
        if self._bash is None:
            r = await self.sandbox.exec("command -v bash >/dev/null", timeout=30)
            self._bash = r.exit_code == 0
        return self._bash

    async def is_alive(self, *, timeout: float | None = None) -> IsAliveResponse:
        try:
            r = await self.sandbox.exec(["true"], timeout=timeout or 30)
        except DSecError as exc:
            return IsAliveResponse(is_alive=False, message=f"{type(exc).__name__}: {exc}")
        return IsAliveResponse(is_alive=r.exit_code == 0,
                               message="" if r.exit_code == 0 else f"exit {r.exit_code}")

    # ---- sessions ----
    async def create_session(self, request: CreateSessionRequest) -> CreateSessionResponse:
        if request.session in self._shells:
            raise SessionExistsError(f"session {request.session!r} already exists")
        shell = await self.sandbox.shell()
        output = ""
        if await self._has_bash():
            r = await shell.run(init_line(request.session, request.startup_source),
                                timeout=max(request.startup_timeout, 30))
            output = r.stdout + r.stderr
        else:
            for path in request.startup_source:
                r = await shell.run(f". {shlex.quote(path)}", timeout=request.startup_timeout)
                output += r.stdout + r.stderr
        self._shells[request.session] = shell
        return CreateBashSessionResponse(output=output)

    def _shell(self, session: str) -> AsyncShell:
        shell = self._shells.get(session)
        if shell is None:
            raise SessionDoesNotExistError(f"session {session!r} does not exist")
        return shell

    async def run_in_session(self, action: Action) -> Observation:
        shell = self._shell(action.session)
        if isinstance(action, BashInterruptAction):
            # a command that timed out was already killed (its shell lives on): nothing runs
            return BashObservation(output="", exit_code=0)
        if action.is_interactive_command or action.is_interactive_quit:
            raise Unsupported("interactive programs (is_interactive_command) need a terminal; "
                              "dsec shells feed each command stdin from /dev/null. Run the "
                              "program non-interactively (a script, a heredoc)")
        return await self._run(shell, action)

    async def _run(self, shell: AsyncShell, action: BashAction) -> BashObservation:
        command = action.command if action.command.strip() else ":"
        bash = await self._has_bash()
        line = bash_line(action.session, command) if bash else sh_line(command)
        r = await shell.run(line, timeout=action.timeout, max_output=MAX_OUTPUT)
        if SYNTAX_MARK in r.stderr:
            err = r.stderr.split(SYNTAX_MARK)[0].rstrip("\n")
            raise BashIncorrectSyntaxError(
                f"bash -n refused the command {action.command!r}:\n{err}",
                extra_info={"bash_stdout": "", "bash_stderr": err})
        if r.timed_out:
            raise CommandTimeoutError(f"timeout ({action.timeout}s) exceeded while running "
                                      f"{action.command!r}; the command was killed")
        output = r.stdout + r.stderr
        obs = BashObservation(output=output, exit_code=None if action.check == "ignore"
                              else r.exit_code)
        if action.check == "raise" and r.exit_code != 0:
            msg = (f"Command {action.command!r} failed with exit code {r.exit_code}. "
                   f"Here is the output:\n{output!r}")
            raise NonZeroExitCodeError(f"{action.error_msg}: {msg}" if action.error_msg else msg)
        return obs

    async def close_session(self, request: CloseSessionRequest) -> CloseSessionResponse:
        shell = self._shell(request.session)
        del self._shells[request.session]
        await shell.close()
        return CloseBashSessionResponse()

    # ---- commands and files ----
    async def execute(self, command: Command) -> CommandResponse:
        argv = _argv(command)
        r = await self.sandbox.exec(argv, cwd=command.cwd, env=command.env,
                                    timeout=command.timeout, max_output=MAX_OUTPUT)
        if r.timed_out:
            raise CommandTimeoutError(f"Timeout ({command.timeout}s) exceeded while running "
                                      "command")
        out = CommandResponse(stdout=r.stdout, stderr=r.stderr, exit_code=r.exit_code)
        if command.check and r.exit_code != 0:
            msg = (f"Command {command.command!r} failed with exit code {r.exit_code}. "
                   f"Stdout:\n{r.stdout!r}\nStderr:\n{r.stderr!r}")
            raise NonZeroExitCodeError(f"{command.error_msg}: {msg}" if command.error_msg
                                       else msg)
        return out

    async def read_file(self, request: ReadFileRequest) -> ReadFileResponse:
        try:
            data = await self.sandbox.files.read(request.path)
        except NotFound as exc:
            raise FileNotFoundError(f"{request.path}: {exc}") from exc
        return ReadFileResponse(content=data.decode(request.encoding or "utf-8",
                                                    request.errors or "strict"))

    async def write_file(self, request: WriteFileRequest) -> WriteFileResponse:
        parent = str(PurePosixPath(request.path).parent)
        await self.sandbox.files.mkdir(parent, parents=True)
        await self.sandbox.files.write(request.path, request.content.encode())
        return WriteFileResponse()

    async def upload(self, request: UploadRequest) -> UploadResponse:
        source = Path(request.source_path)
        if source.is_dir():
            await self.sandbox.files.mkdir(request.target_path, parents=True)
            await self.sandbox.files.upload_dir(source, request.target_path)
        else:
            parent = str(PurePosixPath(request.target_path).parent)
            await self.sandbox.files.mkdir(parent, parents=True)
            await self.sandbox.files.upload(source, request.target_path)
        return UploadResponse()

    async def close(self) -> CloseResponse:
        """Close every session (the sandbox itself is the deployment's to stop)."""
        for name in list(self._shells):
            shell = self._shells.pop(name)
            try:
                await shell.close()
            except DSecError:
                pass  # the sandbox is already gone
        return CloseResponse()


def _argv(command: Command) -> list[str]:
    """What ``subprocess.run(command, shell=..., stderr=STDOUT if merged)`` would start."""
    cmd = command.command
    if command.shell:
        script = cmd if isinstance(cmd, str) else cmd[0]
        extra = [] if isinstance(cmd, str) else ["sh", *cmd[1:]]
        argv = ["/bin/sh", "-c", script or ":", *extra]
    else:
        argv = [cmd] if isinstance(cmd, str) else list(cmd)
    if command.merge_output_streams:
        argv = ["/bin/sh", "-c", 'exec "$@" 2>&1', "sh", *argv]
    return argv
