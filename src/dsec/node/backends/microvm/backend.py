"""The microvm backend: each sandbox is a QEMU ``microvm`` guest with its own kernel.

Per sandbox, under ``<state>/sandboxes/<id>/``:
  backend      "microvm" (how the node's orphan sweep finds the owner)
  launch.json  the LaunchSpec QEMU was started from (restore rebuilds the same machine)
  netns        the guest's network namespace (bind-mounted; QEMU runs in it)
  qemu.pid, qmp.sock, agent.sock   the running QEMU, its control socket, the agent's
               virtio-serial port (multiplexed by serialmux)
  rw.img       the writable disk (sparse ext4, ``disk_mb``; or a qcow2 over a template's)
  console.log  the drained serial console, size-capped
  saved.mig    guest RAM and device state while paused to disk
The guest boots the Debian kernel with dsec's initramfs, which mounts the image's EROFS
layers (the layer blob files, shared read-only by every guest) under an overlay on rw.img
and runs the dsec-agent on a virtio-serial port, which the node multiplexes into one
channel per connection (:mod:`.serialmux`). The guest's network is QEMU user networking
inside the guest's own namespace: its outgoing connections become QEMU's own sockets there,
so egress is the namespace's, loopback only until the node's network policy adds a veth and
nftables rules (:mod:`dsec.node.host.netpolicy`), exactly as for a container.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import shutil
from pathlib import Path
from typing import Literal

from dsec.api.models import SandboxSpec
from dsec.images.models import LayerInfo
from dsec.node.agent.client import AgentConnector
from dsec.node.backends.base import Backend, Reclaim, ReclaimPlan, SandboxRecord
from dsec.node.backends.microvm import accel as accel_mod
from dsec.node.backends.microvm import snapshot
from dsec.node.backends.microvm.cgroup import cgroup_rel, memory_limit, release, set_frozen
from dsec.node.backends.microvm.config import MicroVMConfig
from dsec.node.backends.microvm.console import console_tail, drain_console, oom_count
from dsec.node.backends.microvm.files import AgentFiles
from dsec.node.backends.microvm.guest import GuestArtifacts, ensure_guest
from dsec.node.backends.microvm.pack import pack_guest_upper
from dsec.node.backends.microvm.qemu import LaunchSpec, kill_qemu, launch, read_pid
from dsec.node.backends.microvm.qmp import QMPError, qmp
from dsec.node.backends.microvm.runtime import (FAILED_STATES, connect_sync, make_scratch,
                                                 netns_path, port_connector, qemu_pss,
                                                 save_launch, wait_ready)
from dsec.node.density import cpuclass, prefetch
from dsec.node.density.reclaim import reclaim_cgroup, reclaim_running, restore_cgroup
from dsec.node.host import cgroups, netns
from dsec.node.host.imagelinks import ImageLinks, merged_view

__all__ = ["MicroVMBackend", "MicroVMConfig"]

class MicroVMBackend(Backend):
    """Runs sandboxes as QEMU microvm guests; see the module docstring for the layout."""

    name = "microvm"
    machine: Literal["microvm", "q35"] = "microvm"
    cpu_classes = frozenset(cpuclass.CPU_CLASSES)
    can_reclaim = True

    def __init__(self, state_dir: Path, images, agent_binary: Path | None = None,
                 config: MicroVMConfig | None = None) -> None:
        self.state_dir = Path(state_dir)
        self.images = images
        self.agent_binary = agent_binary
        self.config = config or MicroVMConfig()
        self._art: GuestArtifacts | None = None
        self._accel: str | None = None if self.config.accel == "auto" else self.config.accel
        self._template_lock = asyncio.Lock()
        self._setup_lock = asyncio.Lock()
        self.image_links = ImageLinks()  # the create-time hard-link check, per image once
        if self.config.ksm:
            enable_ksm()

    def protects_paths(self) -> None:
        """Protected paths are kept by the agent with the guest kernel's Landlock (Debian's
        6.1: ABI 2, so the agent also refuses truncate(2) with seccomp); Unsupported when
        that kernel does not run Landlock."""
        from dsec.node.protection import check_guest_kernel
        check_guest_kernel(cmdline=self.config.kernel_args)

    # ---- paths and shared setup ----
    def sandbox_dir(self, sb_id: str) -> Path:
        return self.state_dir / "sandboxes" / sb_id

    @property
    def guest_dir(self) -> Path:
        return self.config.guest_dir or self.state_dir / "microvm" / "guest"

    async def artifacts(self) -> GuestArtifacts:
        """The guest kernel and initramfs, built on first use."""
        async with self._setup_lock:  # a burst of first creates builds (and probes) once
            if self._art is None:
                self._art = await asyncio.to_thread(ensure_guest, self.guest_dir,
                                                    self.agent_binary)
        return self._art

    async def accel(self) -> str:
        """``kvm`` or ``tcg`` for this node (probed once, then cached on disk)."""
        art = await self.artifacts()
        async with self._setup_lock:
            if self._accel is None:
                self._accel = await accel_mod.detect_accel(self.guest_dir, self.config.qemu,
                                                           art)
        return self._accel

    async def launch_spec(self, s: SandboxSpec, d: Path,
                          hostname: str) -> tuple[LaunchSpec, dict]:
        """The machine for sandbox spec ``s`` and the image facts the node keeps."""
        art = await self.artifacts()
        resolved = await asyncio.to_thread(self.images.resolve, s.image, s.layers)
        # One host file per layer, shared read-only by every guest (a lazy FUSE file when
        # the layer lives in a remote store).
        blobs = [await asyncio.to_thread(self.images.layer_file, dg)
                 for dg in resolved.layer_digests]
        spec = LaunchSpec(
            qemu=self.config.qemu, machine="microvm", accel=await self.accel(),
            memory_mb=s.memory_mb, vcpus=max(1, math.ceil(s.cpu)),
            kernel=art.kernel if self.config.uncompressed_kernel else art.bzimage,
            initrd=art.initrd, layers=blobs, scratch=d / "rw.img", workdir=d,
            netns=netns_path(d),
            hostname=hostname,
            cmdline=self.config.kernel_args, cpu=s.cpu)
        facts = {"image_env": resolved.config.env, "image_cwd": resolved.config.cwd or "/",
                 "image_user": resolved.config.user or "root",
                 "layer_digests": list(resolved.layer_digests)}
        return spec, facts

    # ---- lifecycle ----
    async def start(self, rec: SandboxRecord) -> dict:
        d = self.sandbox_dir(rec.id)
        d.mkdir(parents=True, exist_ok=True)
        (d / "backend").write_text(self.name)
        try:
            if rec.spec.protected_paths:  # before any disk is built or guest booted
                await asyncio.to_thread(self._refuse_stray_links, rec.spec)
            spec, facts = await self.launch_spec(rec.spec, d, _hostname(rec.id))
            spec = spec.model_copy(update={"cgroup": rec.id, "cpu_class": rec.spec.cpu_class})
            # The guest's network namespace outlives its QEMU (a guest saved to disk comes
            # back in it) and is where the node plumbs egress, as for a container.
            await asyncio.to_thread(netns.create, netns_path(d))
            if self.config.warm_start:
                template = await self.ensure_template(rec.spec)
                await snapshot.clone(template, d, spec.hostname, rec.id, rec.spec.cpu,
                                     cpu_class=rec.spec.cpu_class)
            else:
                await self._boot(spec, rec.spec.disk_mb)
        except BaseException:
            await self.stop(rec)
            raise
        return {"dir": str(d), "accel": spec.accel, "warm": self.config.warm_start,
                "netns": str(netns_path(d)), **facts}

    def _refuse_stray_links(self, s: SandboxSpec) -> None:
        """InvalidArgument if the image gives a protected file a name outside the protected
        paths (a hard link in a layer): the guest's root is the layers' merged view (a vm's
        disk is copied from it), so it is looked at here, on the host."""
        resolved = self.images.resolve(s.image, s.layers)
        self.image_links.check(
            resolved.layer_digests, s.protected_paths,
            lambda: merged_view(resolved.lowerdirs, self.state_dir / "microvm" / "links"))

    async def prepare_disks(self, spec: LaunchSpec, disk_mb: int) -> None:
        """Create the guest's writable disk before QEMU starts."""
        await asyncio.to_thread(make_scratch, spec.workdir / "rw.img", disk_mb)

    async def _boot(self, spec: LaunchSpec, disk_mb: int) -> LaunchSpec:
        await self.prepare_disks(spec, disk_mb)
        spec = await launch(spec)
        save_launch(spec)
        await wait_ready(spec.workdir, self.config.boot_timeout_s)
        return spec

    async def ensure_template(self, s: SandboxSpec) -> Path:
        """A booted, saved guest for ``s``'s image and machine size, made once per node.

        Clones restore its RAM and put a copy-on-write disk over its frozen disk."""
        root = self.state_dir / "microvm" / "templates"
        probe, _ = await self.launch_spec(s, root, "dsec-template")
        key = template_key(probe, s.disk_mb)
        tdir = root / key
        if snapshot.saved_path(tdir).exists():
            return tdir
        async with self._template_lock:
            if snapshot.saved_path(tdir).exists():
                return tdir
            await kill_qemu(tdir)  # a template half made when the node died
            await asyncio.to_thread(netns.remove, netns_path(tdir))
            await asyncio.to_thread(shutil.rmtree, tdir, True)
            tdir.mkdir(parents=True)
            try:
                # The template's paths are its final ones: clones' qcow2 files name its disk.
                disks = {f: tdir / getattr(probe, f).name for f in ("scratch", "boot_disk")
                         if getattr(probe, f) is not None}  # microvm: scratch; vm: boot disk
                spec = probe.model_copy(update={"workdir": tdir, "netns": netns_path(tdir),
                                                **disks})
                await asyncio.to_thread(netns.create, netns_path(tdir))
                await self._boot(spec, s.disk_mb)
                await snapshot.save(tdir)
                for disk in disks.values():
                    disk.chmod(0o444)
            except BaseException:
                await kill_qemu(tdir)
                await asyncio.to_thread(netns.remove, netns_path(tdir))
                await asyncio.to_thread(shutil.rmtree, tdir, True)
                raise
            finally:
                # Clones run in their own namespaces: the template's served its boot only.
                await asyncio.to_thread(netns.remove, netns_path(tdir))
        return tdir

    async def drop_templates(self) -> None:
        """Remove every saved template (live clones keep their own disk's backing file
        open, but new clones of a dropped template boot it again)."""
        await asyncio.to_thread(shutil.rmtree, self.state_dir / "microvm" / "templates", True)

    async def stop(self, rec: SandboxRecord) -> None:
        d = self.sandbox_dir(rec.id)
        if read_pid(d) is not None:
            await asyncio.to_thread(_thaw, rec.id)  # a reclaim cut short by a node crash
            await asyncio.to_thread(drain_console, d, self.config.console_log_bytes)
        await kill_qemu(d)
        await asyncio.to_thread(netns.remove, netns_path(d))
        await asyncio.to_thread(release, rec.id)
        await asyncio.to_thread(shutil.rmtree, d, True)

    async def pause(self, rec: SandboxRecord) -> None:
        d = self.sandbox_dir(rec.id)
        if self.config.pause_to_disk:
            await snapshot.save(d)
        else:
            await qmp(d / "qmp.sock", "stop")

    async def resume(self, rec: SandboxRecord) -> None:
        d = self.sandbox_dir(rec.id)
        if snapshot.saved_path(d).exists():
            await snapshot.restore(d)
            await wait_ready(d, self.config.boot_timeout_s)
        else:
            await qmp(d / "qmp.sock", "cont")

    async def alive(self, rec: SandboxRecord) -> bool:
        d = self.sandbox_dir(rec.id)
        if snapshot.saved_path(d).exists():
            return True
        if read_pid(d) is None:
            return False
        if rec.state == "paused":  # QMP-stopped (and maybe frozen by a reclaim cut short)
            await asyncio.to_thread(_thaw, rec.id)
        try:
            status = (await qmp(d / "qmp.sock", "query-status", timeout=5.0))["status"]
        except QMPError:
            return False
        return status not in FAILED_STATES

    def connector(self, rec: SandboxRecord) -> AgentConnector:
        return port_connector(self.sandbox_dir(rec.id))

    def files(self, rec: SandboxRecord) -> AgentFiles:
        d = self.sandbox_dir(rec.id)
        return AgentFiles(lambda: connect_sync(d))

    def oom_kills(self, rec: SandboxRecord) -> int:
        d = self.sandbox_dir(rec.id)
        drain_console(d, self.config.console_log_bytes)
        return oom_count(d)

    def memory_bytes(self, rec: SandboxRecord) -> int:
        """Proportional set size of the guest's QEMU: pages KSM merged count shared."""
        return qemu_pss(self.sandbox_dir(rec.id))

    # ---- density: QEMU's cgroup, as a container's ----
    def reclaim(self, rec: SandboxRecord, plan: ReclaimPlan) -> Reclaim:
        """Push a paused guest's memory (guest RAM is QEMU's anonymous memory) out of its
        cgroup. QEMU is frozen meanwhile (its vCPUs are stopped already; its main loop
        then cannot allocate against a lowered v1 limit), thawed once done."""
        if snapshot.saved_path(self.sandbox_dir(rec.id)).exists():
            return Reclaim(0, 0, 0, True, "saved to disk: its QEMU holds nothing")
        frozen = set_frozen(rec.id, True)
        try:
            return reclaim_cgroup(cgroups.detect(), cgroup_rel(rec.id),
                                  memory_limit(rec.spec.memory_mb), plan)
        finally:
            if frozen:
                set_frozen(rec.id, False)

    def restore(self, rec: SandboxRecord) -> None:
        """Limits back (no swap), then QEMU's swapped memory read back before ``cont``."""
        if snapshot.saved_path(self.sandbox_dir(rec.id)).exists():
            return
        driver, rel = cgroups.detect(), cgroup_rel(rec.id)
        _thaw(rec.id)
        restore_cgroup(driver, rel, memory_limit(rec.spec.memory_mb))
        prefetch.prefetch(driver.procs(rel))

    def reclaim_idle(self, rec: SandboxRecord, plan: ReclaimPlan) -> Reclaim:
        """One step on a running guest's QEMU: the coldest guest pages go first."""
        return reclaim_running(cgroups.detect(), cgroup_rel(rec.id),
                               memory_limit(rec.spec.memory_mb), plan)

    async def pack_diff(self, rec: SandboxRecord, tag: str,
                        exclude: list[str] | None = None) -> LayerInfo:
        """Pack the guest's writable layer as a new layer over its image and tag the result.

        Read through the guest's agent (the host never mounts what a guest wrote); the
        guest keeps running meanwhile, so quiesce the work in it first for a consistent
        snapshot. ``exclude``: sandbox paths or globs left out (``/.dsec`` always is)."""
        base = await asyncio.to_thread(self.images.resolve, rec.spec.image, rec.spec.layers)
        files = self.files(rec)
        return await asyncio.to_thread(pack_guest_upper, self.images, files.connect, tag,
                                       base, exclude)

    def console(self, rec: SandboxRecord) -> str:
        """The guest's serial console so far (capped), for debugging."""
        return console_tail(self.sandbox_dir(rec.id), self.config.console_log_bytes)


def template_key(spec: LaunchSpec, disk_mb: int) -> str:
    """What a clone must share with its template: layers or base disk, machine and size,
    kernel, accel."""
    parts = [str(p) for p in spec.layers] + [
        spec.machine, str(spec.boot_base), str(spec.memory_mb), str(spec.vcpus), str(disk_mb),
        spec.accel, str(spec.kernel), str(spec.initrd)]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def _hostname(sb_id: str) -> str:
    return "".join(c if c.isalnum() or c == "-" else "-" for c in sb_id)[:63] or "dsec"


def _thaw(sb_id: str) -> None:
    try:
        set_frozen(sb_id, False)
    except (OSError, TimeoutError):
        pass  # gone already, or stuck: the caller's own step says what failed


def enable_ksm() -> bool:
    """Turn KSM on (node-wide); False when this host has none or denies it."""
    try:
        run = Path("/sys/kernel/mm/ksm/run")
        if run.read_text().strip() != "1":
            run.write_text("1")
        return True
    except OSError:
        return False


