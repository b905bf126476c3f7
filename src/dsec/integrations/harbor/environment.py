"""A Harbor environment provider on dsec: a task runs in one dsec container sandbox.

    harbor run -p TASK_DIR -a oracle -e dsec.integrations.harbor:DsecEnvironment \\
        --ek url=http://127.0.0.1:7070 --ek token=dsec_... [--ek image=python:3.11]

dsec builds no Dockerfiles here: the sandbox starts from the dsec image named by the
``image`` option, else from the task's ``docker_image`` (build the task's
``environment/Dockerfile`` into dsec under that name with ``dsec image build``, or pull it
with ``dsec image pull``), else, for a task with neither a ``docker_image`` nor a
Dockerfile, from ``python:3.11``. A task without a Dockerfile has its ``environment/``
files uploaded into its ``workdir`` (Harbor's prebuilt-image flow). Exec runs ``bash -c``
(``sh -c`` in an image without bash); files move through dsec's files API (tar for
directories). Harbor needs Python >= 3.12; this module is imported by Harbor's process only.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path, PurePosixPath
from typing import Any

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.environments.options import EnvironmentOptions
from harbor.models.task.config import NetworkMode
from harbor.models.trial.paths import EnvironmentPaths
from pydantic import Field

import dsec

__all__ = ["DsecEnvironment", "DsecOptions"]

DEFAULT_IMAGE = "python:3.11"


class DsecOptions(EnvironmentOptions):
    """``--ek`` options of the dsec environment."""

    url: str | None = Field(None, description="dsec gateway URL (default: DSEC_URL)")
    token: str | None = Field(None, description="dsec token (default: DSEC_TOKEN)")
    image: str | None = Field(None, description="dsec image to start from (default: the "
                                                "task's docker_image, else "
                                                f"{DEFAULT_IMAGE})")
    memory_mb: int = Field(2048, ge=64, description="sandbox memory, MiB")
    disk_mb: int = Field(4096, ge=64, description="sandbox writable layer, MiB")


class DsecEnvironment(BaseEnvironment):
    """See the module docstring."""

    options_model = DsecOptions

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._client: dsec.AsyncClient | None = None
        self._sandbox = None
        self._shell = "bash"

    @staticmethod
    def type() -> str:
        return "dsec"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(disable_internet=True)

    def _validate_definition(self) -> None:
        """Nothing to check: the sandbox starts from a dsec image, not a Dockerfile."""

    def _image(self) -> str:
        """The dsec image the sandbox starts from (see the module docstring)."""
        if self.options.image:
            return self.options.image
        if wanted := self.task_env_config.docker_image:
            return wanted  # dsec's create names the ways to get it when the node lacks it
        dockerfile = self.environment_dir / "Dockerfile"
        if dockerfile.exists():
            # a build on the node gives the image a name that both sides then agree on
            raise ValueError(f"the dsec environment builds no Dockerfile: build it into dsec "
                             f"with `dsec image build {dockerfile} --tag NAME` on the node, "
                             f"then set [environment] docker_image = \"NAME\" in task.toml "
                             f"or pass --ek image=NAME")
        return DEFAULT_IMAGE

    async def start(self, force_build: bool) -> None:
        opts = self.options
        mode = self.network_policy.network_mode
        if mode != NetworkMode.NO_NETWORK:
            # the policy must hold exactly: dsec gives a sandbox no route out by default
            raise ValueError(f"the dsec environment runs tasks without network; this task "
                             f"asks network_mode={mode.value!r}: set [environment] "
                             'network_mode = "no-network" in its task.toml')
        self._client = dsec.AsyncClient(opts.url, opts.token)
        image = self._image()
        cpus = self._effective_cpus or 1
        memory = self._effective_memory_mb or opts.memory_mb
        self._sandbox = await self._client.create(
            image=image, cpu=float(cpus), memory_mb=int(memory), disk_mb=opts.disk_mb,
            network="none", labels={"harbor.session": self.session_id[:200]})
        probe = await self._sandbox.exec("command -v bash >/dev/null", timeout=30)
        self._shell = "bash" if probe.exit_code == 0 else "sh"
        if workdir := self.task_env_config.workdir:
            await self._sandbox.files.mkdir(workdir, parents=True)
        # what Docker's providers mount from the host: here plain directories, downloaded
        paths = EnvironmentPaths.for_os(self.os)
        await self.ensure_dirs([*self._mount_targets(writable_only=True), paths.agent_dir,
                                paths.verifier_dir, paths.artifacts_dir])
        self.logger.debug(f"dsec sandbox {self._sandbox.id} of {image}")
        await self._upload_environment_dir_after_start()

    async def stop(self, delete: bool) -> None:
        sandbox, client = self._sandbox, self._client
        self._sandbox = self._client = None
        try:
            if sandbox is not None:
                try:
                    await sandbox.stop()
                except dsec.NotFound:
                    pass
        finally:
            if client is not None:
                await client.close()

    def _sb(self):
        if self._sandbox is None:
            raise RuntimeError("the dsec environment is not started")
        return self._sandbox

    async def exec(self, command: str, cwd: str | None = None,
                   env: dict[str, str] | None = None, timeout_sec: int | None = None,
                   user: str | int | None = None) -> ExecResult:
        user = user if user is not None else self.default_user
        cwd = cwd or self.task_env_config.workdir
        r = await self._sb().exec([self._shell, "-c", command], cwd=cwd,
                                  env={**self._persistent_env, **(env or {})},
                                  user=None if user is None else str(user),
                                  timeout=timeout_sec, max_output=8 << 20)
        code = 124 if r.timed_out else r.exit_code
        return ExecResult(stdout=r.stdout, stderr=r.stderr, return_code=code)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        files = self._sb().files
        await files.mkdir(str(PurePosixPath(target_path).parent), parents=True)
        await files.upload(source_path, target_path)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        files = self._sb().files
        await files.mkdir(target_dir, parents=True)
        await files.upload_dir(source_dir, target_dir)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        Path(target_path).parent.mkdir(parents=True, exist_ok=True)
        await self._sb().files.download(source_path, target_path)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        data = await self._sb().files.download_tar(source_dir)
        dest = Path(target_dir)
        dest.mkdir(parents=True, exist_ok=True)
        top = PurePosixPath(source_dir).name
        with tarfile.open(fileobj=io.BytesIO(data)) as tf:
            members = tf.getmembers()
            for m in members:  # dsec's tar names the directory itself; Harbor wants its inside
                parts = PurePosixPath(m.name.removeprefix("./")).parts
                if parts and parts[0] == top:
                    m.name = str(PurePosixPath(*parts[1:])) if parts[1:] else "."
            tf.extractall(dest, members=[m for m in members if m.name != "."],
                          filter="data")
