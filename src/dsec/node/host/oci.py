"""The OCI runtime spec (config.json) dsec hands to runc for a container sandbox.

Hardening follows Docker's defaults: a reduced capability set, ``no_new_privs``, masked
and read-only /proc and /sys paths, a seccomp allowlist (Docker's default profile as
Debian's containers-common ships it, resolved for :data:`CAPABILITIES`, plus dsec's own
refusals: see :mod:`dsec.node.host.seccomp`), and rlimits inside the host's hard limits.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from dsec.node.host import seccomp

__all__ = ["ContainerConfig", "build_config", "mask_plan", "CAPABILITIES"]

# Docker's default set minus NET_RAW (no raw sockets for port scans) and MKNOD.
CAPABILITIES = [
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_SETGID", "CAP_SETUID",
    "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL",
    "CAP_AUDIT_WRITE",
]

# Files runc hides under a bind of /dev/null: no mount of their own.
MASKED_FILES = [
    "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
    "/proc/timer_stats", "/proc/sched_debug", "/proc/kpagecgroup", "/proc/kpagecount",
    "/proc/kpageflags",
]
# Directories: runc hides each under a read-only tmpfs of its own, a superblock per directory
# per sandbox. Every superblock registers a memcg-aware shrinker and the kernel keeps
# shrinker state per (memory cgroup, shrinker), so each one costs kernel memory in proportion
# to the number of sandboxes: N sandboxes of s superblocks cost O(s x N^2) (issue 12).
MASKED_DIRS = ["/proc/acpi", "/proc/asound", "/proc/scsi", "/sys/firmware",
               "/sys/devices/virtual/powercap", "/sys/kernel/debug"]
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
    # None: /dev/shm is a 64 MiB tmpfs of its own (Docker's default); else this host
    # directory (mode 1777, in the sandbox's rw tmpfs) is bound there.
    shm_dir: str | None = None
    # runc hides these under a read-only tmpfs each (absent ones it skips)
    masked_dirs: list[str] = field(default_factory=lambda: list(MASKED_DIRS))
    # these are read-only binds of ``empty_dir``, an empty host directory, instead (they
    # must exist in the sandbox's sysfs: runc cannot make a mountpoint in a read-only one)
    hidden_dirs: list[str] = field(default_factory=list)
    empty_dir: str | None = None


def mask_plan(root: Path = Path("/")) -> tuple[list[str], list[str]]:
    """(masked_dirs, hidden_dirs) for this host: :data:`MASKED_DIRS` split into what runc
    must mask with a tmpfs and what a bind of an empty directory hides at no superblock.

    /proc: runc refuses binds inside /proc, so these stay runc's, except a directory that
    is procfs's own here (no mask over it in the node's view) and empty: procfs content is
    the kernel's, the same in every pid namespace, so the sandbox's fresh procfs shows it
    empty too and a tmpfs over it hides nothing. An absent one stays runc's (the node's
    /proc may be mounted with subset=pid; the sandbox's is not). Checked at every create,
    so a directory a module fills later is masked from then on.
    /sys: an existing directory is hidden by a bind. /sys/kernel/debug is empty in the
    sandbox's fresh sysfs and it has no CAP_SYS_ADMIN to mount debugfs there, but hiding it
    is free, so it stays hidden. An absent one stays runc's.
    """
    masked, hidden = [], []
    proc = root / "proc"
    for d in MASKED_DIRS:
        p = root / d.lstrip("/")
        if d.startswith("/proc/"):
            try:
                if os.stat(p).st_dev == os.stat(proc).st_dev:
                    with os.scandir(p) as it:
                        if next(it, None) is None:
                            continue
            except OSError:
                pass
            masked.append(d)
        elif p.is_dir():
            hidden.append(d)
        else:
            masked.append(d)
    return masked, hidden


def _hidden(cfg: ContainerConfig) -> list[str]:
    return cfg.hidden_dirs if cfg.empty_dir is not None else []


def _mounts(cfg: ContainerConfig) -> list[dict]:
    base = [
        {"destination": "/proc", "type": "proc", "source": "proc",
         "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
        _shm(cfg),
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
         "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs",
         "options": ["nosuid", "noexec", "nodev", "ro"]},
    ]
    # Spec mounts come before runc's masks (it masks after pivot_root), so these binds land
    # on the fresh sysfs above and nothing is masked over them.
    for d in _hidden(cfg):
        base.append({"destination": d, "type": "bind", "source": cfg.empty_dir,
                     "options": ["bind", "ro", "nosuid", "nodev", "noexec"]})
    for src, dst in cfg.binds:
        base.append({"destination": dst, "type": "bind", "source": src,
                     "options": ["rbind", "ro", "nosuid", "nodev"]})
    return base


def _shm(cfg: ContainerConfig) -> dict:
    if cfg.shm_dir is None:
        return {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
                "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]}
    # A directory of the sandbox's rw tmpfs rather than a tmpfs of its own (one superblock
    # less, see MASKED_DIRS): shared memory then counts against disk_mb, not a separate
    # 64 MiB, and is charged to the sandbox's memory cgroup as before.
    return {"destination": "/dev/shm", "type": "bind", "source": cfg.shm_dir,
            "options": ["bind", "nosuid", "nodev", "noexec"]}


def masked_paths(cfg: ContainerConfig) -> list[str]:
    """What runc masks itself: the files (with /dev/null) and ``masked_dirs`` (a tmpfs each);
    ``hidden_dirs`` too when there is no ``empty_dir`` to bind over them."""
    return MASKED_FILES + cfg.masked_dirs + \
        [d for d in cfg.hidden_dirs if cfg.empty_dir is None]


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
            "maskedPaths": masked_paths(cfg),
            "readonlyPaths": READONLY,
            "seccomp": seccomp.sandbox_filter(CAPABILITIES, seccomp_profile),
        },
    }
