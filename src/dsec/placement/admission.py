"""Admission: may this node take one more sandbox? Pure, no I/O."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["NodeLoad", "AdmissionPolicy", "admit", "fitting", "room"]


@dataclass(frozen=True)
class NodeLoad:
    """What a node holds now; the figures placement and admission decide on."""

    node_id: str
    backends: tuple[str, ...]
    cpus: int
    memory_mb: int
    sandboxes: int
    memory_reserved_mb: int
    cpu_reserved: float


@dataclass(frozen=True)
class AdmissionPolicy:
    """Limits a node enforces; idle sandboxes use little, so memory is overcommitted."""

    max_sandboxes: int = 4096
    memory_overcommit: float = 8.0
    cpu_overcommit: float = 64.0


def admit(load: NodeLoad, backend: str, memory_mb: int, cpu: float,
          policy: AdmissionPolicy = AdmissionPolicy(), count: int = 1) -> str | None:
    """None when the node can take ``count`` more such sandboxes, else the reason it cannot."""
    if backend not in load.backends:
        return f"node {load.node_id} has no {backend!r} backend"
    if load.sandboxes + count > policy.max_sandboxes:
        return f"node {load.node_id} holds {load.sandboxes} sandboxes (limit {policy.max_sandboxes})"
    mem_cap = load.memory_mb * policy.memory_overcommit
    if load.memory_reserved_mb + memory_mb * count > mem_cap:
        return (f"node {load.node_id} has {load.memory_reserved_mb} MiB reserved of "
                f"{mem_cap:.0f} MiB it may promise; {count} x {memory_mb} MiB more do not fit")
    cpu_cap = load.cpus * policy.cpu_overcommit
    if load.cpu_reserved + cpu * count > cpu_cap:
        return (f"node {load.node_id} has {load.cpu_reserved:g} CPUs reserved of {cpu_cap:g} "
                f"it may promise; {count} x {cpu:g} CPUs more do not fit")
    return None


def room(load: NodeLoad, backend: str, memory_mb: int, cpu: float,
         policy: AdmissionPolicy = AdmissionPolicy()) -> int:
    """How many more such sandboxes the node may take now (0 without the backend)."""
    if backend not in load.backends:
        return 0
    by_count = policy.max_sandboxes - load.sandboxes
    by_mem = (load.memory_mb * policy.memory_overcommit - load.memory_reserved_mb) / max(
        memory_mb, 1)
    by_cpu = (load.cpus * policy.cpu_overcommit - load.cpu_reserved) / max(cpu, 1e-9)
    return max(0, int(min(by_count, by_mem + 1e-9, by_cpu + 1e-9)))


def fitting(load: NodeLoad, backend: str, memory_mb: int, cpu: float,
            policy: AdmissionPolicy = AdmissionPolicy(), count: int = 1) -> int:
    """How many of ``count`` such sandboxes the node may take now."""
    return min(count, room(load, backend, memory_mb, cpu, policy))
