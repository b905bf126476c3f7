"""Saving a guest to disk and bringing it back; clones from a saved template.

Save: vCPUs stopped, RAM and device state streamed by QEMU migration into a file the node
opened and handed over (``getfd``; QEMU's seccomp sandbox may not open files itself), then
QEMU ends, freeing all guest memory. Restore: a new QEMU with the same devices reads it
back (``-incoming fd:N``). A clone is a restore of a template's state onto a copy-on-write
qcow2 over the template's frozen disk; it then gets its own hostname, clock and entropy.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from pathlib import Path

from dsec.api.errors import Internal
from dsec.node.agent.client import AgentProcess, SpawnRequest
from dsec.node.backends.microvm.console import drain_console
from dsec.node.backends.microvm.qemu import LaunchSpec, kill_qemu, launch
from dsec.node.backends.microvm.qmp import qmp, qmp_sync
from dsec.node.backends.microvm.runtime import (load_launch, netns_path, port_connector,
                                                 save_launch)

__all__ = ["save", "restore", "saved_path", "clone", "set_identity"]


def saved_path(d: Path) -> Path:
    """Where a guest paused to disk keeps its state."""
    return d / "saved.mig"


async def _wait_migration(sock: Path, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = await qmp(sock, "query-migrate")
        status = info.get("status")
        if status == "completed":
            return
        if status in ("failed", "cancelled"):
            raise Internal(f"saving the guest failed: {info.get('error-desc', status)}")
        await asyncio.sleep(0.05)
    raise Internal(f"saving the guest took longer than {timeout_s:g}s")


async def save(d: Path) -> Path:
    """Stop the guest, write its state to ``saved.mig`` and end its QEMU."""
    sock = d / "qmp.sock"
    await qmp(sock, "stop")
    tmp = d / "saved.mig.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        await asyncio.to_thread(qmp_sync, sock, [
            ("getfd", {"fdname": "dsec-save"}),
            ("migrate-set-parameters", {"max-bandwidth": 1 << 40}),
            ("migrate", {"uri": "fd:dsec-save"})], send_fd=fd)
    finally:
        os.close(fd)
    await _wait_migration(sock)
    load_launch(d)  # the restore needs it: fail now rather than lose the guest later
    await asyncio.to_thread(drain_console, d)
    await kill_qemu(d)
    os.replace(tmp, saved_path(d))
    return saved_path(d)


async def _incoming(spec: LaunchSpec, state: Path, timeout_s: float = 300.0) -> LaunchSpec:
    fd = os.open(state, os.O_RDONLY)
    try:
        spec = await launch(spec.model_copy(update={"incoming_fd": fd}))
    finally:
        os.close(fd)
    spec = spec.model_copy(update={"incoming_fd": None})
    deadline = time.monotonic() + timeout_s
    while True:
        status = (await qmp(spec.qmp_socket, "query-status"))["status"]
        if status == "paused" or status == "running":
            break
        if status != "inmigrate" or time.monotonic() > deadline:
            await kill_qemu(spec.workdir)
            raise Internal(f"restoring the guest failed (QEMU state {status})")
        await asyncio.sleep(0.02)
    if status == "paused":
        await qmp(spec.qmp_socket, "cont")
    return spec


async def restore(d: Path) -> LaunchSpec:
    """Start the guest saved in ``d`` again (in its own network namespace, which stayed);
    removes the state."""
    spec = await _incoming(load_launch(d), saved_path(d))
    save_launch(spec)
    saved_path(d).unlink()
    await set_identity(d, spec.hostname)
    return spec


async def clone(template: Path, d: Path, hostname: str, cgroup: str | None = None,
                cpu: float = 1.0, qemu_img: str = "qemu-img",
                cpu_class: str = "latency") -> LaunchSpec:
    """Start a guest in ``d`` from the template saved in ``template`` (warm start).

    Its writable disk (a microvm's scratch disk, a vm's boot disk) becomes a copy-on-write
    qcow2 over the template's, which stays frozen."""
    tpl = load_launch(template)
    if tpl.boot_disk is not None:  # vm: the whole disk
        base, fmt, disk = tpl.boot_disk, "qcow2", d / "disk.qcow2"
        update = {"boot_disk": disk}
    else:
        base, fmt, disk = tpl.scratch, tpl.scratch_format, d / "rw.qcow2"
        update = {"scratch": disk, "scratch_format": "qcow2"}
    proc = await asyncio.create_subprocess_exec(
        qemu_img, "create", "-q", "-f", "qcow2", "-F", fmt,
        "-b", str(base), str(disk), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise Internal(f"qemu-img create failed: {out.decode(errors='replace')[-500:]}")
    spec = tpl.model_copy(update={"workdir": d, "hostname": hostname, "cgroup": cgroup,
                                  "cpu": cpu, "cpu_class": cpu_class, "netns": netns_path(d), **update})
    spec = await _incoming(spec, saved_path(template))
    save_launch(spec)
    await set_identity(d, hostname)
    return spec


async def set_identity(d: Path, hostname: str, timeout_s: float = 30.0) -> None:
    """Give a restored guest its hostname, the current time and fresh entropy."""
    script = 'hostname "$1"; date -s "@$2" >/dev/null; cat > /dev/urandom'
    req = SpawnRequest(argv=["/.dsec/busybox", "sh", "-c", script, "sh", hostname,
                             str(int(time.time()))], env={"PATH": "/.dsec"},
                       unconfined=True)  # sets the clock and hostname: not a user command

    async def run() -> None:
        proc = await AgentProcess.start(port_connector(d), req)
        proc.write_stdin(secrets.token_bytes(64))
        proc.close_stdin()
        await proc.drain()
        while (await proc.next_event())[0] != "exit":
            pass

    await asyncio.wait_for(run(), timeout_s)
