"""Per-guest runtime helpers shared by the backends and snapshots: the files in a sandbox
directory (launch spec, agent port), readiness, and the guest's host memory."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from dsec.api.errors import Internal, SandboxTimeout
from dsec.node.agent.client import AgentConnector, ping
from dsec.node.backends.microvm import serialmux
from dsec.node.backends.microvm.console import console_tail
from dsec.node.backends.microvm.qemu import LaunchSpec, agent_socket, read_pid
from dsec.node.backends.microvm.qmp import QMPError, qmp
from dsec.node.host.procfs import pss

__all__ = ["FAILED_STATES", "make_scratch", "save_launch", "load_launch",
           "netns_path", "port_connector", "connect_sync", "wait_ready", "guest_status",
           "qemu_pss"]

FAILED_STATES = {"shutdown", "guest-panicked", "internal-error", "io-error"}
PANIC_MARK = "Kernel panic - not syncing"


def make_scratch(path: Path, disk_mb: int) -> None:
    """A sparse raw disk of ``disk_mb`` MiB with an empty ext4 (journal, lazy init)."""
    with open(path, "wb") as f:
        f.truncate(disk_mb << 20)
    mkfs = shutil.which("mkfs.ext4") or "/sbin/mkfs.ext4"
    if not os.path.exists(mkfs):
        return  # the guest formats a blank disk itself (busybox mke2fs), more slowly
    proc = subprocess.run([mkfs, "-q", "-F", "-m", "0", "-E",
                           "lazy_itable_init=1,lazy_journal_init=1", str(path)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise Internal(f"mkfs.ext4 of the sandbox disk failed: {proc.stderr[-500:]}")


def save_launch(spec: LaunchSpec) -> None:
    """Record how the guest's QEMU was started (a restore starts the same machine)."""
    (spec.workdir / "launch.json").write_text(spec.model_dump_json())


def netns_path(d: Path) -> Path:
    """The guest's own network namespace file in its sandbox directory."""
    return d / "netns"


def port_connector(d: Path) -> AgentConnector:
    """Connects to the guest's agent over its virtio-serial port (a new channel each; a
    guest with no QEMU running refuses, as its port's socket does)."""
    async def connect():
        return await serialmux.connect(agent_socket(d), limit=1 << 21)
    return connect


def connect_sync(d: Path, timeout: float = 10.0) -> socket.socket:
    """A blocking connection to the guest's agent, for worker threads (files)."""
    return serialmux.connect_sync(agent_socket(d), timeout)


async def wait_ready(d: Path, timeout_s: float) -> None:
    """Wait until the agent answers; fail early if the guest powered off or panicked."""
    deadline = time.monotonic() + timeout_s
    connector = port_connector(d)
    for i in itertools.count():
        # Short attempts: until the guest's network is up, QEMU accepts the connection
        # and then holds it unanswered, so a long timeout would only add latency.
        if await ping(connector, timeout=0.25 if i < 40 else 1.0):
            return
        status = await guest_status(d)
        # A panic whose reboot does not happen would otherwise wait out the whole timeout.
        if status is not None and status not in FAILED_STATES and i % 8 == 7:
            if PANIC_MARK in await asyncio.to_thread(console_tail, d, 1 << 16):
                status = "guest-panicked"
        if status is None or status in FAILED_STATES:
            tail = await asyncio.to_thread(console_tail, d)
            why = "QEMU exited" if status is None else f"the guest stopped ({status})"
            raise Internal(f"guest failed to boot: {why}; console:\n{tail}")
        if time.monotonic() > deadline:
            tail = await asyncio.to_thread(console_tail, d)
            raise SandboxTimeout(f"guest agent did not answer within {timeout_s:g}s; "
                                 f"console:\n{tail}")
        await asyncio.sleep(0.1)


async def guest_status(d: Path) -> str | None:
    if read_pid(d) is None:
        return None
    try:
        return (await qmp(d / "qmp.sock", "query-status", timeout=5.0))["status"]
    except QMPError:
        return None if read_pid(d) is None else "unknown"


def qemu_pss(d: Path) -> int:
    """Pss of the guest's QEMU process in bytes (0 when it is not running)."""
    pid = read_pid(d)
    return 0 if pid is None else pss(pid)


def load_launch(d: Path) -> LaunchSpec:
    """The LaunchSpec :func:`save_launch` recorded in ``d``."""
    return LaunchSpec.model_validate(json.loads((d / "launch.json").read_text()))
