"""A container sandbox cannot reach the kernel interfaces Docker's default profile keeps out.

New user namespaces would hand a command a full capability set in them (sethostname,
CAP_NET_ADMIN, nf_tables); io_uring, bpf, perf events, keyrings and userfaultfd are the
kernel's largest attack surface for an unprivileged process; ptrace and its relatives would
let a command inspect the in-sandbox agent. A static probe (``kernel_probe.c``, built with
the host's gcc) calls each one and prints the errno it got.
"""

import errno
import shutil
import subprocess
from pathlib import Path

import pytest

REFUSED = {errno.EPERM, errno.ENOSYS}
PROBED = [
    "clone_newuser", "clone_newnet", "clone3_newuser", "unshare_newuser", "unshare_newns",
    "setns", "mount", "io_uring_setup", "io_uring_enter", "io_uring_register", "bpf",
    "perf_event_open", "keyctl", "add_key", "request_key", "userfaultfd", "kexec_load",
    "kexec_file_load", "init_module", "finit_module", "delete_module", "clock_settime",
    "clock_adjtime", "settimeofday", "swapon", "swapoff", "ptrace", "process_vm_readv",
    "process_vm_writev", "pidfd_getfd", "kcmp",
]


@pytest.fixture(scope="session")
def probe(tmp_path_factory) -> bytes:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed (make setup installs it)")
    out = tmp_path_factory.mktemp("probe") / "kernel_probe"
    src = Path(__file__).with_name("kernel_probe.c")
    subprocess.run(["gcc", "-static", "-O1", "-o", str(out), str(src)], check=True)
    return out.read_bytes()


async def _run_probe(sb, probe: bytes) -> dict[str, int]:
    await sb.files.write("/tmp/kernel_probe", probe, mode=0o755)
    r = await sb.exec(["/tmp/kernel_probe"], timeout=30)
    assert r.exit_code == 0, r
    return {name: int(code) for name, code in (line.split() for line in r.stdout.splitlines())}


async def test_every_probed_syscall_is_refused(sandbox, probe):
    got = await _run_probe(sandbox, probe)
    assert got["fork"] == 0, got  # the probe itself can still fork
    allowed = {name: got[name] for name in PROBED if got[name] not in REFUSED}
    assert not allowed, f"reachable from a sandbox (name: errno, 0 = succeeded): {allowed}"


async def test_unshare_applet_cannot_make_a_user_namespace(sandbox):
    r = await sandbox.exec("unshare -U true")
    assert r.exit_code != 0, r
    assert (await sandbox.exec("unshare -U -r hostname evil")).exit_code != 0


async def test_ordinary_work_still_runs(sandbox):
    r = await sandbox.exec("echo a | tr a b && sh -c 'sleep 0.1 & wait' && ls / >/dev/null"
                           " && date >/dev/null && hostname")
    assert r.exit_code == 0 and r.stdout.startswith("b\n"), r
