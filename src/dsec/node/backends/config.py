"""Node-level settings of the container and fncall backends (``NodeConfig.container``,
``NodeConfig.fncall``); the microvm and vm backends' are :class:`MicroVMConfig`."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ContainerBackendConfig", "FncallConfig"]


class ContainerBackendConfig(BaseModel):
    """Node-level settings of the container backend."""

    model_config = ConfigDict(extra="forbid")

    runc: str = Field("runc", description="the OCI runtime binary (a name on PATH or a path)")
    runc_sees_host: bool = Field(
        False, description="start runc in the host's mount namespace, where it reads every "
                           "sandbox's mounts on each create (the old way, a benchmark's "
                           "baseline); by default it starts in a namespace of its own "
                           "without them, so a create costs the same on a full node")


class FncallConfig(BaseModel):
    """Node-level settings of the fncall backend's worker pools."""

    model_config = ConfigDict(extra="forbid")

    max_workers: int | None = Field(
        None, ge=1, description="workers per pool at most; default twice the node's cores")
    warm: int = Field(2, ge=0, description="idle workers kept ready once a pool is used")
    preload: tuple[str, ...] = Field(
        (), description="Python modules the warm interpreter imports before forking calls")
    idle_s: float = Field(300.0, gt=0, description="a pool with no call this long stops "
                                                   "its workers; the next call starts it again")
