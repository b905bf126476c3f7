"""The OCI runtime spec (config.json) dsec hands to runc for a container sandbox.

Hardening follows Docker's defaults: a reduced capability set, ``no_new_privs``, masked
and read-only /proc and /sys paths, a seccomp allowlist (Docker's default profile as
Debian's containers-common ships it, resolved for :data:`CAPABILITIES`, plus dsec's own
refusals: see :mod:`dsec.node.host.seccomp`), and rlimits inside the host's hard limits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dsec.node.host import seccomp

__all__ = ["ContainerConfig", "build_config", "CAPABILITIES"]

# Docker's default set minus NET_RAW (no raw sockets for port scans) and MKNOD.
CAPABILITIES = [
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_SETGID", "CAP_SETUID",
    "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL",
    "CAP_AUDIT_WRITE",
]

MASKED = [
    "/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
    "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
    "/proc/kpagecgroup", "/proc/kpagecount", "/proc/kpageflags", "/sys/firmware",
    "/sys/devices/virtual/powercap", "/sys/kernel/debug",
]
READONLY = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]

NOFILE_LIMIT = 4096  # well inside the host's hard limit of open files


@dataclass
class ContainerConfig:
    """What varies per sandbox; the rest of the spec is fixed policy."""

    hostname: str
    rootfs: str
    args: list[str]
    env: list[str]
    cgroups_path: str
    cpu: float
    memory_mb: int
    pids: int
    binds: list[tuple[str, str]] = field(default_factory=list)  # (host file, container path)
    netns_path: str | None = None


def _mounts(cfg: ContainerConfig) -> list[dict]:
    base = [
        {"destination": "/proc", "type": "proc", "source": "proc",
         "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
         "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
         "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs",
         "options": ["nosuid", "noexec", "nodev", "ro"]},
    ]
    for src, dst in cfg.binds:
        base.append({"destination": dst, "type": "bind", "source": src,
                     "options": ["rbind", "ro", "nosuid", "nodev"]})
    return base


def build_config(cfg: ContainerConfig,
                 seccomp_profile: Path = seccomp.DEFAULT_PROFILE) -> dict:
    """The full config.json for ``runc run``; ``seccomp_profile`` is the moby-format
    profile the sandbox's filter is resolved from."""
    period = 100_000
    mem = cfg.memory_mb * 1024 * 1024
    namespaces = [{"type": t} for t in ("pid", "ipc", "uts", "mount")]
    namespaces.append({"type": "network", **({"path": cfg.netns_path} if cfg.netns_path else {})})
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": cfg.args,
            "env": cfg.env,
            "cwd": "/",
            "capabilities": {k: CAPABILITIES for k in
                             ("bounding", "effective", "permitted")},
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": NOFILE_LIMIT, "soft": NOFILE_LIMIT}],
            "noNewPrivileges": True,
        },
        "root": {"path": cfg.rootfs, "readonly": False},
        "hostname": cfg.hostname,
        "mounts": _mounts(cfg),
        "linux": {
            "cgroupsPath": cfg.cgroups_path,
            "resources": {
                "devices": [{"allow": False, "access": "rwm"}],
                "memory": {"limit": mem, "swap": mem},
                "cpu": {"quota": max(1000, int(cfg.cpu * period)), "period": period},
                "pids": {"limit": cfg.pids},
            },
            "namespaces": namespaces,
            "maskedPaths": MASKED,
            "readonlyPaths": READONLY,
            "seccomp": seccomp.sandbox_filter(CAPABILITIES, seccomp_profile),
        },
    }
