"""Build a layer from a small spec file: copy files and run steps on a base, then pack.

A spec is TOML (or JSON)::

    tag = "toolkit/hello:v1"
    base = "busybox"
    layers = []                      # extra layers stacked on the base
    env = { GREETING = "hi" }
    workdir = "/workspace"
    exclude = ["/root/.cache"]       # cleaned out before packing
    steps = [
      { copy = "hello.sh", to = "/usr/local/bin/hello" },   # relative to the spec's folder
      { run = "chmod +x /usr/local/bin/hello && mkdir -p /workspace" },
    ]

Steps run on an overlay of the base; the overlay's upper dir is packed with ``pack_diff``.
The runner is pluggable: :class:`ChrootRunner` (new mount, pid, uts, ipc and, unless
``network = true``, net namespaces, then chroot) needs nothing but util-linux; a node can
pass a runner that starts a real sandbox instead.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import tomllib
from collections.abc import Callable
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dsec.api.errors import InvalidArgument, SandboxTimeout

__all__ = ["BuildSpec", "BuildStep", "BuildFailed", "StepRunner", "ChrootRunner", "load_spec",
           "run_steps"]


class BuildFailed(InvalidArgument):
    """A build step exited non-zero; the message has its number, command and output tail."""


class BuildStep(BaseModel):
    """One step: ``run`` a shell command, or ``copy`` a file or folder ``to`` a path."""

    model_config = ConfigDict(extra="forbid")

    run: str | None = Field(None, description="Shell command run with /bin/sh -c.")
    copy_: str | None = Field(None, alias="copy", description="Path relative to the spec file.")
    to: str | None = Field(None, description="Absolute destination path of a copy.")

    @model_validator(mode="after")
    def _one_kind(self) -> BuildStep:
        if (self.run is None) == (self.copy_ is None):
            raise ValueError("a step has exactly one of 'run' or 'copy'")
        if self.copy_ is not None and not (self.to or "").startswith("/"):
            raise ValueError("a copy step needs an absolute 'to'")
        return self

    def describe(self) -> str:
        """Short text for a progress display."""
        return f"RUN {self.run}" if self.run is not None else f"COPY {self.copy_} {self.to}"


class BuildSpec(BaseModel):
    """What to build (see the module docstring for the file format)."""

    model_config = ConfigDict(extra="forbid")

    tag: str = Field(description="Tag of the resulting image.")
    base: str = Field("busybox", description="Image to build on.")
    layers: list[str] = Field(default_factory=list, description="Extra layers on the base.")
    env: dict[str, str] = Field(default_factory=dict, description="Env for steps and image.")
    workdir: str | None = Field(None, description="Working directory of steps and image.")
    exclude: list[str] = Field(default_factory=list, description="Paths cleaned before packing.")
    steps: list[BuildStep] = Field(default_factory=list, description="Steps, in order.")
    network: bool = Field(False, description="Let run steps use the host network.")
    timeout_s: float = Field(600.0, gt=0, description="Time limit of each run step.")
    labels: dict[str, str] = Field(default_factory=dict, description="Labels of the image.")
    entrypoint: list[str] | None = Field(None, description="Entrypoint of the image.")


def load_spec(path: pathlib.Path) -> BuildSpec:
    """Read a TOML or JSON spec file."""
    path = pathlib.Path(path)
    try:
        raw = path.read_bytes()
        data = json.loads(raw) if path.suffix == ".json" else tomllib.loads(raw.decode())
        return BuildSpec.model_validate(data)
    except FileNotFoundError:
        raise InvalidArgument(f"spec file {path} does not exist") from None
    except (ValueError, ValidationError) as exc:
        raise InvalidArgument(f"spec file {path}: {exc}") from exc


class StepRunner(Protocol):
    """Runs one command inside a root filesystem; returns (exit code, combined output)."""

    def run(self, rootfs: pathlib.Path, command: str, env: dict[str, str], cwd: str,
            network: bool, timeout: float) -> tuple[int, str]: ...


_SCRIPT = r"""
set -e
root=$1; cwd=$2; cmd=$3; chroot=$4; image_path=$5
mount -t proc proc "$root/proc"
mount -t tmpfs -o mode=755,nosuid dev "$root/dev"
for d in null:1:3 zero:1:5 full:1:7 random:1:8 urandom:1:9 tty:5:0; do
  IFS=:; set -- $d; IFS=' '
  mknod -m 666 "$root/dev/$1" c "$2" "$3"
done
PATH=$image_path
exec "$chroot" "$root" /bin/sh -c 'mkdir -p "$1" && cd "$1" && eval "$2"' sh "$cwd" "$cmd"
"""


class ChrootRunner:
    """Run steps with unshare + chroot (root on the node; no container runtime needed)."""

    def run(self, rootfs: pathlib.Path, command: str, env: dict[str, str], cwd: str,
            network: bool, timeout: float) -> tuple[int, str]:
        """See :class:`StepRunner`."""
        for d in ("proc", "dev"):
            (rootfs / d).mkdir(exist_ok=True)
        ns = ["--mount", "--pid", "--fork", "--kill-child", "--uts", "--ipc"]
        if not network:
            ns.append("--net")
        host_path = "/usr/sbin:/usr/bin:/sbin:/bin"
        chroot = shutil.which("chroot", path=host_path) or "chroot"
        image_path = env.get("PATH", host_path)
        try:
            r = subprocess.run(["unshare", *ns, "/bin/sh", "-c", _SCRIPT, "build", str(rootfs),
                                cwd, command, chroot, image_path],
                               env={**env, "PATH": host_path},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise SandboxTimeout(f"build step {command!r} ran past {timeout} s") from exc
        return r.returncode, r.stdout.decode(errors="replace")


def _copy_in(context: pathlib.Path, step: BuildStep, merged: pathlib.Path) -> None:
    src = (context / step.copy_).resolve()
    if not src.is_relative_to(context.resolve()):
        raise InvalidArgument(f"copy {step.copy_!r}: outside the spec's folder {context}")
    if not src.exists():
        raise InvalidArgument(f"copy {step.copy_!r}: {src} does not exist")
    dest = merged / step.to.lstrip("/")
    dest.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dest, symlinks=True, dirs_exist_ok=True)
    else:
        shutil.copy2(src, dest)


def run_steps(spec: BuildSpec, context: pathlib.Path, merged: pathlib.Path,
              env: dict[str, str], runner: StepRunner,
              progress: Callable[[int, int, str], None] | None = None) -> None:
    """Run every step of ``spec`` on the mounted overlay ``merged``."""
    n = len(spec.steps)
    for i, step in enumerate(spec.steps, 1):
        if progress:
            progress(i, n, step.describe())
        if step.copy_ is not None:
            _copy_in(context, step, merged)
            continue
        code, out = runner.run(merged, step.run, env, spec.workdir or "/", spec.network,
                               spec.timeout_s)
        if code != 0:
            raise BuildFailed(f"build step {i}/{n} {step.run!r} exited with {code}: "
                              f"{out[-2000:]}")
