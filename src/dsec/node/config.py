"""Node configuration."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from dsec.api.limits import RequestLimits
from dsec.images.registry import RegistryPolicy
from dsec.images.sources import RemoteConfig
from dsec.node.backends.config import ContainerBackendConfig, FncallConfig
from dsec.node.backends.microvm.config import MicroVMConfig
from dsec.node.density.config import DensityConfig
from dsec.placement.admission import AdmissionPolicy
from dsec.trajectory.retention import TrajectoryRetention

__all__ = ["NodeConfig", "default_state_dir"]


def default_state_dir() -> Path:
    import os
    return Path(os.environ.get("DSEC_STATE_DIR", "/var/lib/dsec"))


class NodeConfig(BaseModel):
    """How one node agent runs."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    state_dir: Path = Field(default_factory=default_state_dir,
                            description="node-local state: SQLite, layers, sandbox dirs")
    backends: list[str] = Field(default_factory=lambda: ["container", "fncall", "microvm", "vm"],
                                description="backends to enable on this node")
    start_concurrency: int = Field(8, ge=1, le=256,
                                   description="sandboxes started at once (runc is CPU-bound)")
    reap_interval_s: float = Field(1.0, gt=0, description="how often TTLs are checked")
    warm_pool: dict[str, int] = Field(
        default_factory=dict,
        description="image -> number of container sandboxes kept started ahead of demand")
    images_remote: RemoteConfig | None = Field(
        None, description="a remote layer store (e.g. another dsec server's /v1/blobs) that "
                          "this node loads layers from on demand")
    registry: RegistryPolicy = Field(
        default_factory=RegistryPolicy,
        description="pulling images named by a registry reference ('host:port/repo:tag') "
                    "on first use, and which registries are plain HTTP")
    admission: AdmissionPolicy = Field(default_factory=AdmissionPolicy)
    trajectory: TrajectoryRetention = Field(
        default_factory=TrajectoryRetention,
        description="how long the trajectory log keeps stopped sandboxes' logs")
    max_disk_mb: int = Field(
        16384, ge=16,
        description="largest disk_mb a sandbox may ask for. A container's writable layer "
                    "is a tmpfs: its files are memory, charged to the sandbox's memory "
                    "limit (whoever writes them), so a sandbox holds at most the smaller "
                    "of disk_mb and memory_mb in files")
    max_exec_output: int = Field(
        8 << 20, ge=1 << 16,
        description="most bytes per stream an exec or shell run keeps for its result, "
                    "whatever its max_output asks (the rest is dropped and the result says "
                    "truncated): a result is held in the node's memory, about four times "
                    "over while it is encoded and sent. A streamed exec holds no output "
                    "and is not bounded by this")
    container: ContainerBackendConfig = Field(default_factory=ContainerBackendConfig,
                                              description="settings of the container backend")
    fncall: FncallConfig = Field(default_factory=FncallConfig,
                                 description="settings of the fncall backend's worker pools")
    density: DensityConfig = Field(
        default_factory=DensityConfig,
        description="swap and reclaim of paused and idle sandboxes, CPU classes, KSM")
    guests: MicroVMConfig = Field(default_factory=MicroVMConfig,
                                  description="settings of the microvm and vm backends")
    limits: RequestLimits = Field(default_factory=RequestLimits,
                                  description="what one request may carry (body, labels, "
                                              "env, argv, command and path sizes)")
