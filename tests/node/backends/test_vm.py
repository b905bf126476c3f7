"""The vm backend with a real q35 guest booting its own disk (TCG: one shared guest)."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import pytest
import pytest_asyncio

from dsec.api.errors import InvalidArgument, Unsupported
from dsec.api.models import SandboxSpec
from dsec.images import ImageService
from dsec.node.agent.client import AgentProcess, SpawnRequest
from dsec.node.backends.base import SandboxRecord
from dsec.node.backends.microvm import MicroVMBackend, MicroVMConfig, VMBackend
from dsec.node.backends.microvm.qemu import read_pid
from dsec.node.backends.microvm.keys import text_events
from dsec.node.backends.microvm.vm import png_size
from dsec.node.host import cgroups

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(400)]

GUEST_DIR = Path(__file__).resolve().parents[3] / "build" / "guest"


def record(sb_id: str, backend: str = "vm") -> SandboxRecord:
    now = time.time()
    return SandboxRecord(id=sb_id, spec=SandboxSpec(backend=backend, memory_mb=256),
                         state="creating", created_at=now, last_active_at=now)


async def run(backend, rec, script: str) -> tuple[int, bytes]:
    proc = await AgentProcess.start(backend.connector(rec), SpawnRequest(
        argv=["sh", "-c", script], env={"PATH": "/usr/bin:/bin:/usr/sbin:/sbin"}))
    proc.close_stdin()
    out = b""
    while True:
        kind, data = await proc.next_event()
        if kind == "exit":
            return proc.exit_code, out
        out += data


async def eventually(backend, rec, script: str, timeout: float = 20.0) -> bytes:
    deadline = time.monotonic() + timeout
    while True:
        code, out = await run(backend, rec, script)
        if code == 0 or time.monotonic() > deadline:
            assert code == 0, f"{script!r} still failing after {timeout}s"
            return out
        await asyncio.sleep(0.5)


@pytest.fixture(scope="module")
def state(tmp_path_factory):
    root = tmp_path_factory.mktemp("vm")
    images = ImageService(root)
    images.ensure_busybox()
    yield root, images
    images.unmount_all()
    left = list((root / "sandboxes").iterdir()) if (root / "sandboxes").exists() else []
    shutil.rmtree(root)
    assert not left, f"sandbox files left behind: {left}"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def vm(state):
    root, images = state
    backend = VMBackend(root, images, config=MicroVMConfig(guest_dir=GUEST_DIR,
                                                           boot_timeout_s=240))
    rec = record("sb-vmshared")
    rec.runtime = await backend.start(rec)
    yield backend, rec
    d = backend.sandbox_dir(rec.id)
    await backend.stop(rec)
    assert read_pid(d) is None and not d.exists()
    assert not cgroups.detect().leftovers(f"/dsec/{rec.id}")


async def test_vm_boots_its_own_disk_with_its_own_init(vm):
    backend, rec = vm
    code, out = await run(backend, rec, "cat /proc/1/comm; hostname; cat /proc/cmdline; "
                                        "grep ' / ' /proc/mounts")
    comm, hostname, cmdline, root = out.decode().splitlines()
    # the agent is the init of its commands' own pid namespace (the guest's init, which
    # booted the disk, is outside it: commands cannot signal or trace either)
    assert (code, comm, hostname) == (0, "agent", "sb-vmshared")
    assert "dsec.root=disk" in cmdline and root.startswith("/dev/vda1 / ")


async def test_screenshot_is_a_png_of_the_display(vm):
    backend, rec = vm
    png = await backend.screenshot(rec)
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and png_size(png)[0] >= 640


async def test_typed_text_reaches_the_guest_console(vm):
    backend, rec = vm
    # tty1 runs a shell (the disk's inittab); what is typed there runs in the guest. That
    # shell is outside the pid namespace of the agent's commands, so `ps` cannot see it:
    # type until what was typed shows (keys typed before the shell is up are lost).
    for _ in range(30):
        await backend.type_text(rec, "touch /tmp/Typed_1\n")
        code, _ = await run(backend, rec, "test -e /tmp/Typed_1")
        if code == 0:
            break
        await asyncio.sleep(1)
    assert code == 0, "what was typed on the console never ran"


async def test_click_reaches_the_guest_pointer(vm):
    backend, rec = vm
    dev = await eventually(backend, rec, "grep -l -i tablet /sys/class/input/event*/device/name")
    event = "/dev/input/" + dev.decode().split("/")[4]
    await run(backend, rec, f"head -c 24 {event} > /tmp/ev 2>/dev/null &")
    await asyncio.sleep(1)
    await backend.click(rec, 100, 50)
    await eventually(backend, rec, "test -s /tmp/ev", timeout=10)


async def test_vm_pause_to_disk_and_restore(vm):
    backend, rec = vm
    await run(backend, rec, "echo still > /root-file")
    backend.config.pause_to_disk = True
    try:
        await backend.pause(rec)
        assert read_pid(backend.sandbox_dir(rec.id)) is None
        await backend.resume(rec)
    finally:
        backend.config.pause_to_disk = False
    assert await run(backend, rec, "cat /root-file") == (0, b"still\n")


async def test_vm_clones_start_from_a_saved_template_with_their_own_identity(state):
    root, images = state
    backend = VMBackend(root, images, config=MicroVMConfig(guest_dir=GUEST_DIR,
                                                           boot_timeout_s=240, warm_start=True))
    recs = [record(f"sb-vmclone{i}") for i in range(2)]
    try:
        for r in recs:
            r.runtime = await backend.start(r)
        await run(backend, recs[0], "echo mine > /only-here")
        assert await run(backend, recs[0], "hostname; cat /only-here") == \
            (0, b"sb-vmclone0\nmine\n")
        code, out = await run(backend, recs[1], "hostname; cat /only-here")
        assert out.startswith(b"sb-vmclone1\n") and code != 0
        assert (await backend.screenshot(recs[1])).startswith(b"\x89PNG")
        # Each clone's disk is its own copy-on-write layer over the template's frozen one.
        disks = [backend.sandbox_dir(r.id) / "disk.qcow2" for r in recs]
        assert all(d.exists() for d in disks)
    finally:
        for r in recs:
            await backend.stop(r)
        await backend.drop_templates()


async def test_text_becomes_key_presses_with_shift_where_needed():
    events = text_events("a!")
    assert [e["data"]["key"]["data"] for e in events[0]] == ["a", "a"]
    assert [e["data"]["key"]["data"] for e in events[1]] == ["shift", "1", "1", "shift"]
    with pytest.raises(InvalidArgument):
        text_events("é")


async def test_microvm_has_no_display(state):
    root, images = state
    backend = MicroVMBackend(root, images, config=MicroVMConfig(guest_dir=GUEST_DIR))
    with pytest.raises(Unsupported):
        await backend.screenshot(record("sb-none", "microvm"))
    with pytest.raises(Unsupported):
        await backend.type_text(record("sb-none", "microvm"), "x")


async def test_package_exports_only_the_backends_and_their_config():
    import dsec.node.backends.microvm as pkg
    assert pkg.__all__ == ["MicroVMBackend", "MicroVMConfig", "VMBackend"]
    assert all(getattr(pkg, name) for name in pkg.__all__)
