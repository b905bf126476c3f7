"""Resolving a moby-format seccomp profile, dsec's hardening, and the BPF compilation."""

import errno
import json
import subprocess
import sys

import pytest

from dsec.api.errors import Internal
from dsec.node.host import oci, seccomp

ALLOW, ERRNO = "SCMP_ACT_ALLOW", "SCMP_ACT_ERRNO"
KERNEL = (6, 1)


def _profile(*syscalls, **top) -> dict:
    return {"defaultAction": ERRNO, "defaultErrnoRet": 38,
            "archMap": [{"architecture": "SCMP_ARCH_X86_64",
                         "subArchitectures": ["SCMP_ARCH_X86", "SCMP_ARCH_X32"]},
                        {"architecture": "SCMP_ARCH_AARCH64",
                         "subArchitectures": ["SCMP_ARCH_ARM"]}],
            "syscalls": list(syscalls), **top}


def _names(spec: dict, action: str = ALLOW, with_args: bool = False) -> set[str]:
    return {n for r in spec["syscalls"] if r["action"] == action
            and bool(r.get("args")) == with_args for n in r["names"]}


def _resolve(profile, caps=(), arch="amd64", kernel=KERNEL):
    return seccomp.resolve(profile, caps, arch, kernel)


def test_default_and_architectures_come_from_the_profile():
    spec = _resolve(_profile({"names": ["read"], "action": ALLOW}))
    assert spec["defaultAction"] == ERRNO and spec["defaultErrnoRet"] == 38
    assert spec["architectures"] == ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"]
    assert _resolve(_profile(), arch="arm64")["architectures"] == ["SCMP_ARCH_AARCH64",
                                                                    "SCMP_ARCH_ARM"]


def test_includes_caps_need_every_cap_and_excludes_any():
    p = _profile({"names": ["both"], "action": ALLOW, "includes": {"caps": ["CAP_A", "CAP_B"]}},
                 {"names": ["not_a"], "action": ALLOW, "excludes": {"caps": ["CAP_A", "CAP_C"]}})
    assert _names(_resolve(p, ["CAP_A"])) == set()
    assert _names(_resolve(p, ["CAP_A", "CAP_B"])) == {"both"}
    assert _names(_resolve(p, ["CAP_B"])) == {"not_a"}


def test_arches_and_min_kernel_select_entries():
    p = _profile({"names": ["x86_only"], "action": ALLOW, "includes": {"arches": ["amd64", "x86"]}},
                 {"names": ["not_arm"], "action": ALLOW, "excludes": {"arches": ["arm64"]}},
                 {"names": ["new"], "action": ALLOW, "includes": {"minKernel": "5.6"}},
                 {"names": ["old"], "action": ALLOW, "excludes": {"minKernel": "4.8"}})
    assert _names(_resolve(p, kernel=(6, 1))) == {"x86_only", "not_arm", "new"}
    assert _names(_resolve(p, arch="arm64", kernel=(4, 4))) == {"old"}
    assert _names(_resolve(p, kernel=(5, 6))) == {"x86_only", "not_arm", "new"}


def test_rules_keep_errno_and_args_in_oci_form():
    arg = {"index": 0, "value": 16, "valueTwo": 0, "op": "SCMP_CMP_EQ"}
    p = _profile({"names": ["socket"], "action": ERRNO, "errnoRet": 22, "errno": "EINVAL",
                  "args": [arg], "comment": "", "includes": {}, "excludes": {}},
                 {"name": "old_style", "action": ALLOW, "args": None})
    assert _resolve(p)["syscalls"] == [
        {"names": ["socket"], "action": ERRNO, "errnoRet": 22, "args": [arg]},
        {"names": ["old_style"], "action": ALLOW}]


def test_hardening_replaces_the_profiles_entries_for_its_names():
    p = _profile({"names": ["read", "ptrace", "unshare"], "action": ALLOW},
                 {"names": ["bpf"], "action": ALLOW, "includes": {"caps": ["CAP_SYS_ADMIN"]}})
    hardened = seccomp.harden(p)
    assert hardened["syscalls"][0]["names"] == ["read"]
    assert p["syscalls"][0]["names"] == ["read", "ptrace", "unshare"]  # input left as it was
    for caps in ([], ["CAP_SYS_ADMIN", "CAP_SYS_PTRACE"]):
        assert {"ptrace", "bpf", "io_uring_setup"}.isdisjoint(_names(_resolve(hardened, caps)))


def test_clone_without_sys_admin_is_masked_to_no_namespace_flags():
    spec = _resolve(seccomp.harden(_profile({"names": ["clone", "clone3"], "action": ALLOW})))
    assert "clone" not in _names(spec) and "clone3" not in _names(spec)
    [allow] = [r for r in spec["syscalls"] if r["names"] == ["clone"] and r["action"] == ALLOW]
    assert allow["args"] == [{"index": 0, "value": 0x7E020000, "valueTwo": 0,
                              "op": "SCMP_CMP_MASKED_EQ"}]
    refused = {r["args"][0]["value"] for r in spec["syscalls"]
               if r["names"] == ["clone"] and r["action"] == ERRNO}
    assert seccomp.CLONE_NAMESPACE_FLAGS["CLONE_NEWUSER"] in refused and len(refused) == 7
    assert [r["errnoRet"] for r in spec["syscalls"] if r["names"] == ["clone3"]] == [errno.ENOSYS]


def test_clone_flags_are_the_second_argument_on_s390x():
    spec = _resolve(seccomp.harden(_profile()), arch="s390x")
    assert {r["args"][0]["index"] for r in spec["syscalls"] if r["names"] == ["clone"]} == {1}


def test_sys_admin_lifts_the_namespace_gate():
    spec = _resolve(seccomp.harden(_profile()), ["CAP_SYS_ADMIN"])
    assert {"clone", "clone3", "unshare", "setns", "mount"} <= _names(spec)
    assert "clone" not in _names(spec, with_args=True)


def test_a_missing_profile_names_the_package(tmp_path):
    with pytest.raises(Internal, match="golang-github-containers-common"):
        seccomp.load_profile(tmp_path / "seccomp.json")


def test_build_config_resolves_the_injected_profile(tmp_path):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(_profile({"names": ["read", "ptrace"], "action": ALLOW})))
    cfg = oci.ContainerConfig(hostname="h", rootfs="/r", args=["/a"], env=[], cgroups_path="c",
                              cpu=1, memory_mb=64, pids=64)
    spec = oci.build_config(cfg, seccomp_profile=path)["linux"]["seccomp"]
    assert "read" in _names(spec) and "ptrace" not in _names(spec)


# ---- the installed profile ------------------------------------------------------------

REFUSED = ["io_uring_setup", "io_uring_enter", "io_uring_register", "bpf", "perf_event_open",
           "keyctl", "add_key", "request_key", "userfaultfd", "kexec_load", "kexec_file_load",
           "init_module", "finit_module", "delete_module", "clock_settime", "clock_adjtime",
           "settimeofday", "swapon", "swapoff", "unshare", "setns", "mount", "umount2",
           "pivot_root", "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd",
           "kcmp", "clone3", "reboot"]


@pytest.fixture(scope="module")
def sandbox_spec() -> dict:
    if not seccomp.DEFAULT_PROFILE.exists():
        pytest.skip(f"{seccomp.DEFAULT_PROFILE} is not installed (make setup installs it)")
    return seccomp.sandbox_filter(oci.CAPABILITIES)


def test_the_installed_profile_refuses_the_kernel_surface(sandbox_spec):
    allowed = _names(sandbox_spec) | _names(sandbox_spec, with_args=True)
    assert not allowed & set(REFUSED), allowed & set(REFUSED)
    assert {"read", "write", "execve", "openat", "wait4", "vfork", "socket", "chroot",
            "uname"} <= allowed
    assert "clone" in _names(sandbox_spec, with_args=True)


def test_the_bpf_program_is_a_whole_number_of_instructions(sandbox_spec):
    prog = seccomp.compile_bpf(sandbox_spec)
    assert prog and len(prog) % 8 == 0


CHILD = r"""
import ctypes, os, subprocess, sys
prog = open(sys.argv[1], "rb").read()
libc = ctypes.CDLL(None, use_errno=True)
class Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
fprog = Fprog(len(prog) // 8, prog)
assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
assert libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) == 0, ctypes.get_errno()  # SECCOMP_MODE_FILTER
def errno_of(rc):
    return ctypes.get_errno() if rc < 0 else 0
print("unshare", errno_of(libc.unshare(0x10000000)))  # CLONE_NEWUSER
print("io_uring_setup", errno_of(libc.syscall(425, 4, ctypes.create_string_buffer(120))))
print("true", subprocess.run(["true"]).returncode)
"""


def test_a_process_that_installs_the_program_is_confined(sandbox_spec, tmp_path):
    path = tmp_path / "filter.bpf"
    path.write_bytes(seccomp.compile_bpf(sandbox_spec))
    r = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = dict(line.split() for line in r.stdout.splitlines())
    assert got == {"unshare": str(errno.EPERM), "io_uring_setup": str(errno.ENOSYS),
                   "true": "0"}
