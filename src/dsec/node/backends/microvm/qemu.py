"""Starting one QEMU ``microvm`` guest: the command line, the launch, and the process.

The guest has no device the host did not list: its image layers as read-only virtio-blk
disks (the layer blob files themselves, shared by every guest), one writable disk, one
virtio-net on QEMU user networking, one virtio-serial port for the agent (a unix socket on
the host, multiplexed by :mod:`.serialmux`), and its serial console in an in-QEMU ring buffer
(bounded memory; the node drains it into a size-capped file). A guest power-off or reboot
(the init script's failure path, a kernel panic with ``panic=-1``) pauses QEMU instead of
ending it, so the node can still read the console and report why.

Sandboxes' QEMU runs in the guest's own network namespace with user networking unrestricted:
what the guest reaches is what that namespace routes and its nftables allow. A QEMU in the
host's namespace (the KVM probe, the bare-boot benchmark) has ``restrict=on``: nothing.
"""

from __future__ import annotations

import asyncio
import functools
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from dsec.api.errors import Capacity, Internal
from dsec.node.backends.microvm import serialmux
from dsec.node.backends.microvm.qmp import QMPError, qmp
from dsec.node.host.netns import nsenter_argv

__all__ = ["LaunchSpec", "agent_socket", "qemu_argv", "base_kernel_words", "host_tsc_khz", "launch",
           "pid_alive", "kill_qemu", "read_pid"]

GUEST_NET = "10.0.2.15"
CONSOLE_CHARDEV = "console"
AGENT_CHARDEV = "agent"
AGENT_PORT_NAME = "dsec.agent"  # the guest finds its port by this name in sysfs


class LaunchSpec(BaseModel):
    """Everything one guest's QEMU command line is built from."""

    model_config = ConfigDict(extra="forbid")

    qemu: str = Field("qemu-system-x86_64", description="QEMU binary")
    machine: Literal["microvm", "q35"] = Field("microvm", description="QEMU machine type")
    accel: Literal["kvm", "tcg"] = Field("tcg", description="accelerator")
    memory_mb: int = Field(512, ge=16, description="guest RAM (-m), the memory limit")
    vcpus: int = Field(1, ge=1, le=64, description="guest vCPUs")
    kernel: Path | None = Field(None, description="kernel for direct boot (microvm)")
    initrd: Path | None = Field(None, description="initramfs for direct boot (microvm)")
    cmdline: str = Field("", description="extra kernel command line words")
    layers: list[Path] = Field(default_factory=list,
                               description="read-only layer blobs, bottom first")
    scratch: Path | None = Field(None, description="the writable disk")
    scratch_format: Literal["raw", "qcow2"] = Field(
        "raw", description="qcow2 when the disk is a copy-on-write clone of a template's")
    boot_disk: Path | None = Field(None, description="q35: the disk image to boot (qcow2)")
    boot_base: Path | None = Field(None, description="q35: the shared read-only disk that "
                                                     "boot_disk is a copy-on-write layer over")
    workdir: Path = Field(description="per-guest directory: sockets, pid file")
    hostname: str = Field("dsec", description="guest hostname")
    netns: Path | None = Field(None, description="the guest's own network namespace (a "
                                                 "file, see host.netns): QEMU runs in it, "
                                                 "its user networking is unrestricted and "
                                                 "the namespace's routes and nftables "
                                                 "decide egress; None: host namespace, "
                                                 "restricted (no egress at all)")
    console_bytes: int = Field(1 << 18, ge=4096, description="console ring buffer size")
    display: bool = Field(False, description="q35: a VGA display for screendump and input")
    incoming_fd: int | None = Field(None, description="restore saved state from this fd")
    cgroup: str | None = Field(None, description="sandbox id whose cgroup QEMU joins (the "
                                                 "CPU quota); None: none (templates)")
    cpu: float = Field(1.0, gt=0, description="CPU quota in cores for the cgroup")
    cpu_class: Literal["latency", "best_effort"] = Field(
        "latency", description="the sandbox's CPU class, given to QEMU's cgroup and threads")

    @property
    def qmp_socket(self) -> Path:
        return self.workdir / "qmp.sock"

    @property
    def agent_socket(self) -> Path:
        return agent_socket(self.workdir)

    @property
    def pidfile(self) -> Path:
        return self.workdir / "qemu.pid"


def agent_socket(workdir: Path) -> Path:
    """The host end of a guest's agent port (see :mod:`.serialmux`)."""
    return workdir / "agent.sock"


@functools.cache
def host_tsc_khz() -> int | None:
    """The host's TSC rate in kHz, as well as it can be read without privileges.

    Under TCG a guest's TSC is the host's; a loaded host makes the guest's own calibration
    against its emulated PIT fail (and the boot then hangs), so the rate is handed over."""
    try:
        return int(Path("/sys/devices/system/cpu/cpu0/tsc_freq_khz").read_text())
    except (OSError, ValueError):
        pass
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    m = re.search(r"^model name\s*:.*@\s*([0-9.]+)GHz", info, re.M)
    if m:
        return int(float(m.group(1)) * 1e6)
    m = re.search(r"^cpu MHz\s*:\s*([0-9.]+)", info, re.M)
    return int(float(m.group(1)) * 1000) if m else None


def base_kernel_words(accel: str) -> list[str]:
    """Kernel command line words every dsec guest boots with."""
    # A panic reboots at once, by triple fault (the one reset every machine type has);
    # QEMU turns the reset into a pause (-action) that the node reports as a failure.
    words = ["console=ttyS0", "quiet", "panic=-1", "oops=panic", "reboot=t"]
    khz = host_tsc_khz() if accel == "tcg" else None
    if khz:
        words += [f"tsc_early_khz={khz}", "tsc=reliable"]
    return words


def _drive(i: str, path: Path, ro: bool, serial: str, machine: str, fmt: str = "raw") -> list[str]:
    dev = "virtio-blk-device" if machine == "microvm" else "virtio-blk-pci"
    ro_opt = ",readonly=on" if ro else ""
    return ["-drive", f"if=none,id={i},file={path},format={fmt}{ro_opt}",
            "-device", f"{dev},drive={i},serial={serial}"]


def qemu_argv(spec: LaunchSpec) -> list[str]:
    """The full QEMU command line for ``spec``."""
    mach = ("microvm,acpi=on,mem-merge=on,pcie=off,rtc=on" if spec.machine == "microvm"
            else "q35,mem-merge=on")
    cpu = "host" if spec.accel == "kvm" else "max"
    argv = [spec.qemu, "-name", f"dsec-{spec.hostname}", "-M", mach, "-accel", spec.accel,
            "-cpu", cpu, "-m", str(spec.memory_mb), "-smp", str(spec.vcpus),
            "-nodefaults", "-no-user-config",
            "-action", "reboot=shutdown,shutdown=pause,panic=pause",
            "-qmp", f"unix:{spec.qmp_socket},server=on,wait=off",
            "-chardev", f"ringbuf,id={CONSOLE_CHARDEV},size={spec.console_bytes}",
            "-serial", f"chardev:{CONSOLE_CHARDEV}",
            "-pidfile", str(spec.pidfile),
            "-sandbox", "on,obsolete=deny,resourcecontrol=deny"]
    argv += ["-vga", "std", "-display", "none"] if spec.display else ["-display", "none"]
    if spec.kernel is not None:
        words = [*base_kernel_words(spec.accel), f"dsec.layers={len(spec.layers)}",
                 f"dsec.host={spec.hostname}", spec.cmdline]
        argv += ["-kernel", str(spec.kernel), "-initrd", str(spec.initrd),
                 "-append", " ".join(w for w in words if w)]
    for i, layer in enumerate(spec.layers):
        argv += _drive(f"l{i}", layer, True, f"dsec-l{i}", spec.machine)
    if spec.scratch is not None:
        argv += _drive("rw", spec.scratch, False, "dsec-rw", spec.machine,
                       spec.scratch_format)
    if spec.boot_disk is not None:
        argv += _drive("boot", spec.boot_disk, False, "dsec-boot", spec.machine, "qcow2")
    # Free page reporting: the guest hands pages it freed (boot leftovers, exited work)
    # back to the host, so an idle guest costs what it uses, not what it once touched.
    balloon = "virtio-balloon-device" if spec.machine == "microvm" else "virtio-balloon-pci"
    argv += ["-device", f"{balloon},free-page-reporting=on"]
    # In its own namespace the guest reaches what the namespace routes (nothing until the
    # node plumbs a veth with its rules); in the host's it must not reach anything.
    restrict = "off" if spec.netns is not None else "on"
    # q35: no option ROM on the NIC (iPXE), the guest never boots from the network.
    net_dev = "virtio-net-device" if spec.machine == "microvm" else "virtio-net-pci,romfile="
    argv += ["-netdev", f"user,id=n0,restrict={restrict}", "-device", f"{net_dev},netdev=n0"]
    # The agent's channel: a virtio-serial port, a unix socket on the host (serialmux).
    serial = "virtio-serial-device" if spec.machine == "microvm" else "virtio-serial-pci"
    argv += ["-chardev", f"socket,id={AGENT_CHARDEV},path={spec.agent_socket},server=on,"
                         f"wait=off",
             "-device", f"{serial},max_ports=2",
             "-device", f"virtserialport,chardev={AGENT_CHARDEV},name={AGENT_PORT_NAME}"]
    if spec.display:
        # The keyboard is q35's PS/2 one (built into the guest kernel); the tablet gives
        # absolute pointer positions, which clicks at pixel coordinates need.
        argv += ["-device", "virtio-tablet-pci"]
    if spec.incoming_fd is not None:
        argv += ["-incoming", f"fd:{spec.incoming_fd}"]
    return argv


async def launch(spec: LaunchSpec, ready_s: float = 120.0) -> LaunchSpec:
    """Start QEMU (inside the guest's network namespace when it has one) and return once
    its control socket answers.

    QEMU runs as this process's child, not daemonized: only a parent can reap a process,
    and a daemonized QEMU's parent is the host's init, which may leave it a zombie for
    seconds after a stop (holding its cgroup, visible to ``pgrep``). Its own session keeps
    it out of the node's signals; it outlives the node like any orphan would."""
    spec.workdir.mkdir(parents=True, exist_ok=True)
    prefix = nsenter_argv(spec.netns) if spec.netns is not None else []
    if spec.cgroup is not None:
        prefix = await _cgroup_prefix(spec) + prefix
    pass_fds = (spec.incoming_fd,) if spec.incoming_fd is not None else ()
    log_path = spec.workdir / "qemu.log"
    with open(log_path, "wb") as log_file:
        # Popen in a thread, not asyncio's subprocess: uvloop's process transport waits
        # for every descendant of the child to exit.
        proc = await asyncio.to_thread(
            subprocess.Popen, prefix + qemu_argv(spec), stdin=subprocess.DEVNULL,
            stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
            pass_fds=pass_fds, cwd="/")
    _CHILDREN[_key(spec.workdir)] = proc
    if not await _answers(spec, proc, ready_s):
        await kill_qemu(spec.workdir)
        last = log_path.read_bytes().decode(errors="replace").strip()
        if "Cannot allocate memory" in last:
            raise Capacity(f"QEMU could not allocate {spec.memory_mb} MiB: {last[-500:]}")
        raise Internal(f"QEMU failed to start: {last[-1500:] or 'no answer on its socket'}")
    if spec.cgroup is not None:
        await _confine(spec)
    return spec


async def _answers(spec: LaunchSpec, proc: subprocess.Popen, timeout_s: float) -> bool:
    """Wait until QEMU's QMP socket answers (what ``-daemonize`` waited for: init done,
    main loop running); False when QEMU exited first or never answered."""
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None and time.monotonic() < deadline:
        if spec.qmp_socket.exists():
            try:
                await qmp(spec.qmp_socket, "query-status", timeout=5.0)
                return read_pid(spec.workdir) is not None
            except QMPError:
                pass
        await asyncio.sleep(0.01)
    return False


async def _cgroup_prefix(spec: LaunchSpec) -> list[str]:
    from dsec.node.backends.microvm.cgroup import join_argv, prepare
    try:
        procs = await asyncio.to_thread(prepare, spec.cgroup, spec.cpu, spec.memory_mb,
                                        spec.cpu_class)
    except OSError as exc:
        raise Internal(f"could not make the sandbox's cgroup for QEMU: {exc}") from exc
    return join_argv(procs)


async def _confine(spec: LaunchSpec) -> None:
    """QEMU answers: give its threads the sandbox's CPU class."""
    from dsec.node.backends.microvm.cgroup import set_class
    pid = read_pid(spec.workdir)
    try:
        if pid is None:
            raise OSError("QEMU has no pid file")
        await asyncio.to_thread(set_class, pid, spec.cpu_class)
    except OSError as exc:
        await kill_qemu(spec.workdir)
        raise Internal(f"could not give QEMU the sandbox's CPU class: {exc}") from exc


def read_pid(workdir: Path) -> int | None:
    """The QEMU pid recorded in ``workdir``, if it still names that guest's QEMU."""
    try:
        pid = int((workdir / "qemu.pid").read_text().strip())
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    # A recycled pid would not carry this guest's own pid file path on its command line.
    return pid if str(workdir / "qemu.pid").encode() in cmd else None


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _pids_naming(path: Path) -> list[int]:
    """Processes whose command line names ``path`` (QEMU without a readable pid file)."""
    needle, out = str(path).encode(), []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if needle in (p / "cmdline").read_bytes():
                    out.append(int(p.name))
            except OSError:
                pass
    return out


async def kill_qemu(workdir: Path, grace_s: float = 0.0) -> None:
    """End this guest's QEMU (SIGTERM, then SIGKILL after ``grace_s``), and return once it
    is reaped.

    The pid file is the fast path; a scan for the pid file's path on command lines finds a
    QEMU that died before writing it or whose file was lost."""
    pid = read_pid(workdir)
    pids = [pid] if pid is not None else _pids_naming(workdir / "qemu.pid")
    serialmux.drop(agent_socket(workdir))  # before a new QEMU can take the socket's name
    for pid in pids:
        await _kill(pid, grace_s)
    proc = _CHILDREN.pop(_key(workdir), None)
    if proc is not None:  # ours: reap it (also one that died on its own, a zombie)
        if proc.poll() is None:
            proc.kill()
        await asyncio.to_thread(proc.wait)
    for pid in pids:
        if proc is None or pid != proc.pid:
            await _gone(pid)


async def _kill(pid: int, grace_s: float) -> None:
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        for _ in range(int(wait_s * 50) + 1):
            if not pid_alive(pid):
                return
            await asyncio.sleep(0.02)
    raise Internal(f"QEMU pid {pid} did not exit after SIGKILL")


async def _gone(pid: int, timeout_s: float = 10.0) -> None:
    """Wait for a QEMU this process did not start (one from before a node restart) to be
    reaped by its parent, the host's init."""
    deadline = time.monotonic() + timeout_s
    while _zombie(pid) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def _key(workdir: Path) -> str:
    return os.path.abspath(workdir)


# QEMU processes this process started, by work dir, until they are reaped.
_CHILDREN: dict[str, subprocess.Popen] = {}
