"""Admission: may this node take one more sandbox? Pure, no I/O.

Two guards. Reservations (memory_mb, cpu of the sandboxes held) against the physical
machine times the policy's overcommit ratios; and the node's measured figures (memory
available, swap left, cores busy, PSI pressure), which the node passes in with its load.
Reservations within the physical machine are admitted on reservations alone; past it (idle
sandboxes use a few percent of what they ask for) only while the real figures leave room.
A refusal names the resource that is short.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["NodeLoad", "AdmissionPolicy", "admit", "fitting", "pressure", "room",
           "STARTUP_MB"]

STARTUP_MB = 2  # real memory a just-started idle container takes (measured: ~0.7 MiB)


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
    # Measured by the node; None when it does not measure (a simulated node, an old one).
    memory_available_mb: int | None = None  # MemAvailable
    swap_free_mb: int | None = None         # what swap can still take off RAM (zram: its
    #                                         free space times what compression saves)
    cpu_used: float | None = None           # cores busy over the last seconds
    memory_pressure: float | None = None    # PSI memory "full avg10", % of time
    cpu_pressure: float | None = None       # PSI cpu "some avg10", % of time
    sandbox_cpu_used: float | None = None   # cores the sandboxes themselves keep busy


@dataclass(frozen=True)
class AdmissionPolicy:
    """Limits a node enforces; idle sandboxes use little, so memory is overcommitted."""

    max_sandboxes: int = 16384
    memory_overcommit: float = 16.0
    cpu_overcommit: float = 512.0
    min_free_mb: int = 1024            # RAM available + swap free kept back, always
    max_memory_pressure: float = 10.0  # past reservations: refuse above this PSI full avg10
    max_cpu_busy: float = 0.9          # past reservations: refuse when this share of the
    max_cpu_pressure: float = 90.0     # cores is busy and tasks wait this % of the time


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
    return pressure(load, memory_mb, cpu, policy, count)


def pressure(load: NodeLoad, memory_mb: int, cpu: float,
             policy: AdmissionPolicy = AdmissionPolicy(), count: int = 1) -> str | None:
    """The real-figures guard: None when what the node measured leaves room."""
    if load.memory_available_mb is not None:
        free = load.memory_available_mb + (load.swap_free_mb or 0)
        if free < policy.min_free_mb:
            return (f"node {load.node_id} is short of memory: {load.memory_available_mb} MiB "
                    f"available and {load.swap_free_mb or 0} MiB more that swap could "
                    f"free, under the {policy.min_free_mb} MiB it keeps back")
    if load.memory_reserved_mb + memory_mb * count > load.memory_mb and \
            (load.memory_pressure or 0.0) > policy.max_memory_pressure:
        return (f"node {load.node_id} is under memory pressure: its tasks all stalled on "
                f"memory {load.memory_pressure:.1f} % of the last 10 s (limit "
                f"{policy.max_memory_pressure:g} %), and its memory is overcommitted")
    # The sandboxes' own CPU where the node measures it: a burst of creates keeps the
    # cores busy with the node's work while the sandboxes it made are idle.
    own = load.sandbox_cpu_used is not None
    busy = load.sandbox_cpu_used if own else load.cpu_used
    if load.cpu_reserved + cpu * count > load.cpus and busy is not None and \
            busy >= load.cpus * policy.max_cpu_busy and \
            (load.cpu_pressure or 0.0) >= policy.max_cpu_pressure:
        whose = "its sandboxes keep " if own else ""
        return (f"node {load.node_id} is short of CPU: {whose}{busy:.1f} of {load.cpus} "
                f"cores busy, tasks waiting {load.cpu_pressure:.0f} % of the time, and its "
                f"CPUs are overcommitted")
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
    fit = max(0, int(min(by_count, by_mem + 1e-9, by_cpu + 1e-9)))
    if fit and pressure(load, memory_mb, cpu, policy) is not None:
        return 0
    if fit and load.memory_available_mb is not None:
        # each new sandbox takes some real memory at once: no more than the headroom holds
        spare = load.memory_available_mb + (load.swap_free_mb or 0) - policy.min_free_mb
        fit = min(fit, max(0, int(spare // STARTUP_MB)))
    return fit


def fitting(load: NodeLoad, backend: str, memory_mb: int, cpu: float,
            policy: AdmissionPolicy = AdmissionPolicy(), count: int = 1) -> int:
    """How many of ``count`` such sandboxes the node may take now."""
    return min(count, room(load, backend, memory_mb, cpu, policy))
