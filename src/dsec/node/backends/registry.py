"""Which backends a node builds, by name; heavy ones import lazily."""

from __future__ import annotations

from dsec.api.errors import InvalidArgument
from dsec.node.agent.build import ensure_agent
from dsec.node.backends.base import Backend
from dsec.node.config import NodeConfig
from dsec.node.density.ksm import merge_supported

__all__ = ["make_backends"]


def make_backends(config: NodeConfig) -> dict[str, Backend]:
    from dsec.images import ImageService
    images = ImageService(config.state_dir, remote=config.images_remote,
                          registry=config.registry)
    images.ensure_busybox()
    agent = ensure_agent(config.state_dir / "bin")
    out: dict[str, Backend] = {}
    for name in config.backends:
        if name == "container":
            from dsec.node.backends.container import ContainerBackend
            out[name] = ContainerBackend(config.state_dir, images, agent,
                                         runc=config.container.runc,
                                         runc_sees_host=config.container.runc_sees_host,
                                         merge=config.density.ksm and merge_supported())
        elif name == "fncall":  # pools start lazily, on the first call
            from dsec.node.backends.fncall import FncallBackend
            out[name] = FncallBackend(config.state_dir, images, agent,
                                      **config.fncall.model_dump())
        elif name == "microvm":  # guest kernel and initramfs are built on first use
            from dsec.node.backends.microvm import MicroVMBackend
            out[name] = MicroVMBackend(config.state_dir, images, agent, config.guests)
        elif name == "vm":
            from dsec.node.backends.microvm import VMBackend
            out[name] = VMBackend(config.state_dir, images, agent, config.guests)
        else:
            raise InvalidArgument(f"unknown backend {name!r}; known: container, fncall, "
                                  "microvm, vm")
    return out
