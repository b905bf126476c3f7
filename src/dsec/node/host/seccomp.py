"""The seccomp filter of a sandbox: Docker's default profile, resolved, plus dsec's refusals.

The profile is the one Debian's ``golang-github-containers-common`` package ships (moby
format: ``defaultAction``, ``archMap``, ``syscalls`` whose entries are kept or dropped by
``includes``/``excludes`` on capabilities, architectures and ``minKernel``). It is an
allowlist: a syscall no entry names answers the profile's default, ``ERRNO(ENOSYS)``.
:func:`resolve` does what Docker's daemon does before it hands a profile to runc: it keeps
the entries that apply to the sandbox's capability set, architecture and kernel and emits
the OCI runtime-spec ``linux.seccomp`` form.

The shipped profile (containers-common 0.50) is Podman's, which relies on the kernel's
capability checks more than Docker's does: it allows ``clone``/``clone3`` with any flags,
``unshare``, ``setns``, ``mount``, ``ptrace``, ``keyctl`` and more outright. Docker's own
profile gates those, and an unprivileged process that may create a user namespace gets a
full capability set inside it. :data:`HARDENING` (moby format too, applied by
:func:`harden` before resolution) replaces every entry of the profile for the syscalls it
names:

- Docker's ``CAP_SYS_ADMIN`` gate: without that capability, ``clone`` is allowed only
  without namespace flags (``CLONE_NEWUSER``, ``CLONE_NEWNET``, ... answer EPERM);
  ``clone3`` answers ENOSYS, whose flags seccomp cannot read, so libc falls back to
  ``clone``; ``unshare``, ``setns`` and the mount calls (old and new API) answer EPERM.
  Docker's other gates the profile lacks: ``reboot`` (CAP_SYS_BOOT), ``syslog``
  (CAP_SYSLOG), the NUMA policy calls (CAP_SYS_NICE).
- Refused to every sandbox process whatever its capabilities (EPERM): bpf,
  perf_event_open, the key calls, userfaultfd, kexec, module loading, setting the clock,
  swapon/swapoff, name_to_handle_at (Docker refuses it too). io_uring answers ENOSYS, as
  the profile already does, so runtimes that probe for it fall back.
- Decision on ptrace: Docker allows ``ptrace``, ``process_vm_readv`` and
  ``process_vm_writev`` to every container on kernels >= 4.8, and this profile allows
  them and ``pidfd_getfd`` outright. dsec refuses ``ptrace``, ``process_vm_readv``,
  ``process_vm_writev``, ``pidfd_getfd``, ``kcmp`` and ``process_madvise`` even with
  ``CAP_SYS_PTRACE``: the in-sandbox agent runs as the same uid as the commands it starts
  and must not be inspectable or steerable by them. Debuggers (gdb, strace) therefore do
  not work in a container sandbox; a microvm has its own kernel for that.

No copy of the profile is vendored: a node without the package fails at create with an
error naming it. :func:`compile_bpf` turns a resolved filter into a classic-BPF program
with libseccomp, for guests where runc does not run.
"""

from __future__ import annotations

import copy
import ctypes
import ctypes.util
import errno
import functools
import json
import os
import platform
from collections.abc import Iterable
from pathlib import Path

from dsec.api.errors import Internal

__all__ = ["DEFAULT_PROFILE", "HARDENING", "load_profile", "harden", "resolve",
           "sandbox_filter", "compile_bpf", "host_arch", "host_kernel"]

DEFAULT_PROFILE = Path("/usr/share/containers/seccomp.json")
PACKAGE = "golang-github-containers-common"

# Go's GOARCH names (what the profile's includes/excludes say) and libseccomp's native arch.
_GOARCH = {"x86_64": "amd64", "aarch64": "arm64", "ppc64le": "ppc64le", "s390x": "s390x",
           "riscv64": "riscv64"}
_SCMP_ARCH = {"amd64": "SCMP_ARCH_X86_64", "arm64": "SCMP_ARCH_AARCH64",
              "ppc64le": "SCMP_ARCH_PPC64LE", "s390x": "SCMP_ARCH_S390X",
              "riscv64": "SCMP_ARCH_RISCV64"}

CLONE_NAMESPACE_FLAGS = {
    "CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
_CLONE_MASK = sum(CLONE_NAMESPACE_FLAGS.values())  # 0x7E020000, Docker's mask
_S390 = ["s390", "s390x"]  # clone's flags are its second argument there

# Docker allows these only with the capability named; the shipped profile does not gate them.
_GATED = {
    "CAP_SYS_ADMIN": ["unshare", "setns", "mount", "umount", "umount2", "pivot_root", "fsopen",
                      "fsconfig", "fsmount", "fspick", "open_tree", "move_mount",
                      "mount_setattr"],
    "CAP_SYS_BOOT": ["reboot"],
    "CAP_SYSLOG": ["syslog"],
    "CAP_SYS_NICE": ["get_mempolicy", "mbind", "set_mempolicy", "set_mempolicy_home_node"],
}
_NEVER = ["bpf", "perf_event_open", "keyctl", "add_key", "request_key", "userfaultfd",
          "kexec_load", "kexec_file_load", "create_module", "init_module", "finit_module",
          "delete_module", "query_module", "clock_settime", "clock_settime64",
          "clock_adjtime", "clock_adjtime64", "adjtimex", "settimeofday", "stime", "swapon",
          "swapoff", "name_to_handle_at", "ptrace", "process_vm_readv", "process_vm_writev",
          "pidfd_getfd", "kcmp", "process_madvise"]
_IO_URING = ["io_uring_setup", "io_uring_enter", "io_uring_register"]


def _errno(names: list[str], code: int, **cond) -> dict:
    return {"names": names, "action": "SCMP_ACT_ERRNO", "errnoRet": code, **cond}


def _clone_rules() -> list[dict]:
    """Docker's clone rules: no namespace flags without CAP_SYS_ADMIN."""
    rules = [{"names": ["clone", "clone3"], "action": "SCMP_ACT_ALLOW",
              "includes": {"caps": ["CAP_SYS_ADMIN"]}},
             _errno(["clone3"], errno.ENOSYS, excludes={"caps": ["CAP_SYS_ADMIN"]})]
    for index, arches in ((0, {"excludes": {"caps": ["CAP_SYS_ADMIN"], "arches": _S390}}),
                          (1, {"includes": {"arches": _S390},
                               "excludes": {"caps": ["CAP_SYS_ADMIN"]}})):
        rules.append({"names": ["clone"], "action": "SCMP_ACT_ALLOW", **arches,
                      "args": [{"index": index, "value": _CLONE_MASK, "valueTwo": 0,
                                "op": "SCMP_CMP_MASKED_EQ"}]})
        rules += [_errno(["clone"], errno.EPERM, **arches,
                         args=[{"index": index, "value": flag, "valueTwo": flag,
                                "op": "SCMP_CMP_MASKED_EQ"}])
                  for flag in CLONE_NAMESPACE_FLAGS.values()]
    return rules


def _gate(cap: str, names: list[str]) -> list[dict]:
    return [{"names": names, "action": "SCMP_ACT_ALLOW", "includes": {"caps": [cap]}},
            _errno(names, errno.EPERM, excludes={"caps": [cap]})]


HARDENING: list[dict] = [
    *_clone_rules(),
    *(rule for cap, names in _GATED.items() for rule in _gate(cap, names)),
    _errno(_NEVER, errno.EPERM),
    _errno(_IO_URING, errno.ENOSYS),
]


def load_profile(path: Path = DEFAULT_PROFILE) -> dict:
    """Read a moby-format profile; a missing file says which package provides it."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError as exc:
        raise Internal(f"the seccomp profile {path} is missing: install the Debian package "
                       f"{PACKAGE} (`make setup` does)") from exc
    except (OSError, ValueError) as exc:
        raise Internal(f"cannot read the seccomp profile {path}: {exc}") from exc


def harden(profile: dict, rules: list[dict] = HARDENING) -> dict:
    """``profile`` with every entry for a syscall that ``rules`` name replaced by ``rules``."""
    replaced = {n for rule in rules for n in _names(rule)}
    kept = []
    for entry in profile.get("syscalls") or []:
        names = [n for n in _names(entry) if n not in replaced]
        if names:
            kept.append({**{k: v for k, v in entry.items() if k != "name"}, "names": names})
    return {**profile, "syscalls": kept + copy.deepcopy(rules)}


def resolve(profile: dict, caps: Iterable[str], arch: str, kernel: tuple[int, int]) -> dict:
    """The OCI ``linux.seccomp`` object for a process with ``caps`` on ``arch`` (a GOARCH
    name such as ``amd64``) and kernel ``(major, minor)``, with Docker's semantics: an
    entry applies when all its ``includes`` hold and none of its ``excludes`` does."""
    caps = set(caps)
    out: dict = {"defaultAction": profile["defaultAction"], "architectures": _arches(profile, arch)}
    if profile.get("defaultErrnoRet") is not None:
        out["defaultErrnoRet"] = profile["defaultErrnoRet"]
    out["syscalls"] = [_oci_rule(e) for e in profile.get("syscalls") or []
                       if _applies(e, caps, arch, kernel)]
    return out


def _names(entry: dict) -> list[str]:
    return list(entry.get("names") or []) + ([entry["name"]] if entry.get("name") else [])


def _kernel_at_least(kernel: tuple[int, int], want: str) -> bool:
    major, _, minor = want.partition(".")
    return kernel >= (int(major), int(minor or 0))


def _applies(entry: dict, caps: set[str], arch: str, kernel: tuple[int, int]) -> bool:
    exc, inc = entry.get("excludes") or {}, entry.get("includes") or {}
    if arch in (exc.get("arches") or []) or caps & set(exc.get("caps") or []):
        return False
    if exc.get("minKernel") and _kernel_at_least(kernel, exc["minKernel"]):
        return False
    if inc.get("arches") and arch not in inc["arches"]:
        return False
    if not set(inc.get("caps") or []) <= caps:
        return False
    return not inc.get("minKernel") or _kernel_at_least(kernel, inc["minKernel"])


def _arches(profile: dict, arch: str) -> list[str]:
    native = _SCMP_ARCH.get(arch)
    for entry in profile.get("archMap") or []:
        if entry["architecture"] == native:
            return [native, *(entry.get("subArchitectures") or [])]
    return list(profile.get("architectures") or ([native] if native else []))


def _oci_rule(entry: dict) -> dict:
    rule = {"names": _names(entry), "action": entry["action"]}
    if entry.get("errnoRet") is not None:
        rule["errnoRet"] = entry["errnoRet"]
    if entry.get("args"):
        rule["args"] = [{k: a[k] for k in ("index", "value", "valueTwo", "op") if k in a}
                        for a in entry["args"]]
    return rule


def host_arch() -> str:
    """This machine's architecture as the profile names it (``amd64``, ``arm64``, ...)."""
    machine = platform.machine()
    if machine not in _GOARCH:
        raise Internal(f"no seccomp architecture known for this machine ({machine})")
    return _GOARCH[machine]


def host_kernel() -> tuple[int, int]:
    """The running kernel's ``(major, minor)``, for ``minKernel``."""
    major, minor = os.uname().release.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


@functools.lru_cache(maxsize=16)
def _cached(caps: tuple[str, ...], path: str, arch: str, kernel: tuple[int, int]) -> str:
    return json.dumps(resolve(harden(load_profile(Path(path))), caps, arch, kernel))


def sandbox_filter(caps: Iterable[str], path: Path = DEFAULT_PROFILE, arch: str | None = None,
                   kernel: tuple[int, int] | None = None) -> dict:
    """The hardened profile at ``path`` resolved for a sandbox process with ``caps``
    (this machine's arch and kernel unless given): what runc gets as ``linux.seccomp``."""
    return json.loads(_cached(tuple(sorted(caps)), str(path), arch or host_arch(),
                              kernel or host_kernel()))


# ---- classic BPF through libseccomp, for guests where runc does not run ----------------

_ACTIONS = {"SCMP_ACT_KILL": 0x00000000, "SCMP_ACT_KILL_THREAD": 0x00000000,
            "SCMP_ACT_KILL_PROCESS": 0x80000000, "SCMP_ACT_TRAP": 0x00030000,
            "SCMP_ACT_LOG": 0x7FFC0000, "SCMP_ACT_ALLOW": 0x7FFF0000}
_OPS = {"SCMP_CMP_NE": 1, "SCMP_CMP_LT": 2, "SCMP_CMP_LE": 3, "SCMP_CMP_EQ": 4,
        "SCMP_CMP_GE": 5, "SCMP_CMP_GT": 6, "SCMP_CMP_MASKED_EQ": 7}
_NR_SCMP_ERROR = -1


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


@functools.cache
def _libseccomp() -> ctypes.CDLL:
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name)
    except OSError as exc:
        raise Internal("libseccomp is missing: install the Debian package libseccomp2") from exc
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_arch_resolve_name.restype = ctypes.c_uint32
    lib.seccomp_arch_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_arch_native.restype = ctypes.c_uint32
    lib.seccomp_arch_add.argtypes = lib.seccomp_arch_remove.argtypes = [ctypes.c_void_p,
                                                                        ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                           ctypes.c_uint, ctypes.POINTER(_ArgCmp)]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


def _action(name: str, ret: int | None) -> int:
    if name == "SCMP_ACT_ERRNO":
        return 0x00050000 | ((errno.EPERM if ret is None else ret) & 0xFFFF)
    if name == "SCMP_ACT_TRACE":
        return 0x7FF00000 | ((errno.EPERM if ret is None else ret) & 0xFFFF)
    if name not in _ACTIONS:
        raise Internal(f"seccomp action {name} cannot be compiled to a plain BPF program")
    return _ACTIONS[name]


def _arch_token(lib: ctypes.CDLL, name: str) -> int:
    token = lib.seccomp_arch_resolve_name(name.removeprefix("SCMP_ARCH_").lower().encode())
    if not token:
        raise Internal(f"libseccomp does not know the architecture {name}")
    return token


def _check(rc: int, what: str) -> None:
    if rc < 0:
        raise Internal(f"libseccomp: {what}: {os.strerror(-rc)}")


def compile_bpf(spec: dict) -> bytes:
    """A resolved OCI seccomp object (see :func:`sandbox_filter`) as a classic-BPF program:
    the ``struct sock_filter`` array (8 bytes each) for ``prctl(PR_SET_SECCOMP,
    SECCOMP_MODE_FILTER, &(struct sock_fprog){len(bytes) // 8, bytes})`` after
    ``PR_SET_NO_NEW_PRIVS``. Rules are added as runc adds them: syscalls libseccomp does not
    know are skipped, and so are rules whose action is the default one."""
    lib = _libseccomp()
    default = _action(spec["defaultAction"], spec.get("defaultErrnoRet"))
    ctx = lib.seccomp_init(default)
    if not ctx:
        raise Internal("libseccomp: seccomp_init failed")
    try:
        native = lib.seccomp_arch_native()
        arches = [_arch_token(lib, a) for a in spec.get("architectures") or []] or [native]
        for token in arches:
            if token != native:
                _check(lib.seccomp_arch_add(ctx, token), f"add architecture {token:#x}")
        if native not in arches:
            _check(lib.seccomp_arch_remove(ctx, native), "remove the native architecture")
        for rule in spec.get("syscalls") or []:
            _add_rule(lib, ctx, rule, default)
        fd = os.memfd_create("dsec-seccomp", os.MFD_CLOEXEC)
        try:
            _check(lib.seccomp_export_bpf(ctx, fd), "export the BPF program")
            os.lseek(fd, 0, os.SEEK_SET)
            chunks = []
            while chunk := os.read(fd, 1 << 16):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)
    finally:
        lib.seccomp_release(ctx)


def _add_rule(lib: ctypes.CDLL, ctx: int, rule: dict, default: int) -> None:
    action = _action(rule["action"], rule.get("errnoRet"))
    if action == default:
        return  # libseccomp refuses a rule that repeats the default action
    args = rule.get("args") or []
    cmps = (_ArgCmp * max(1, len(args)))(*[
        _ArgCmp(a["index"], _OPS[a["op"]], a.get("value", 0), a.get("valueTwo", 0))
        for a in args])
    for name in rule["names"]:
        nr = lib.seccomp_syscall_resolve_name(name.encode())
        if nr == _NR_SCMP_ERROR:
            continue  # not a syscall this libseccomp knows (a newer profile than the lib)
        _check(lib.seccomp_rule_add_array(ctx, action, nr, len(args), cmps),
               f"add the rule for {name}")
