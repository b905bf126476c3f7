"""The OCI runtime spec (config.json) dsec hands to runc for a container sandbox.

Hardening follows Docker's defaults: a reduced capability set, ``no_new_privs``, masked
and read-only /proc and /sys paths, a seccomp filter refusing the syscalls Docker's
default profile refuses, and rlimits inside the host's hard limits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ContainerConfig", "build_config", "CAPABILITIES", "BLOCKED_SYSCALLS"]

# Docker's default set minus NET_RAW (no raw sockets for port scans) and MKNOD.
CAPABILITIES = [
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_SETGID", "CAP_SETUID",
    "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL",
    "CAP_AUDIT_WRITE",
]

# Syscalls Docker's default profile does not allow to an unprivileged container.
BLOCKED_SYSCALLS = [
    "acct", "add_key", "bpf", "clock_adjtime", "clock_settime", "create_module",
    "delete_module", "finit_module", "fsconfig", "fsmount", "fsopen", "fspick",
    "get_kernel_syms", "get_mempolicy", "init_module", "ioperm", "iopl", "kcmp",
    "kexec_file_load", "kexec_load", "keyctl", "lookup_dcookie", "mbind", "mount",
    "mount_setattr", "move_mount", "move_pages", "name_to_handle_at", "nfsservctl",
    "open_by_handle_at", "open_tree", "perf_event_open", "personality", "pivot_root",
    "process_vm_readv", "process_vm_writev", "ptrace", "query_module", "quotactl",
    "quotactl_fd", "reboot", "request_key", "set_mempolicy", "setns", "settimeofday",
    "swapoff", "swapon", "sysfs", "syslog", "umount", "umount2", "unshare", "uselib",
    "userfaultfd", "ustat", "vm86", "vm86old", "vmsplice",
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


def _seccomp() -> dict:
    return {
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
        "syscalls": [{"names": BLOCKED_SYSCALLS, "action": "SCMP_ACT_ERRNO", "errnoRet": 1}],
    }


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


def build_config(cfg: ContainerConfig) -> dict:
    """The full config.json for ``runc run``."""
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
            "seccomp": _seccomp(),
        },
    }
