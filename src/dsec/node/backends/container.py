"""The container backend: runc over an overlayfs of shared read-only layers.

Per sandbox, under ``<state>/sandboxes/<id>/``:
  rw/       a tmpfs sized ``disk_mb``: the overlay's upper and work dirs (the disk limit)
            and shm/, bound at the sandbox's /dev/shm (so shared memory counts against
            disk_mb too, and pack_diff of upper/ never sees it)
  rootfs/   the overlay: the image's layer mounts (shared, read-only) + rw/upper
  config.json, runc.log
runc starts in a mount namespace of its own (``dsec-agent bundle``, see
:mod:`dsec.node.host.runcns`) where this directory is bound at ``<state>/bundle`` and every
other sandbox's mounts are detached, so a create does not slow down as the node fills; the
config and runc's own paths name the directory by that bundle path, the node by its own.
The sandbox's main process, its pid 1, is ``dsec-agent serve-fd 3``: being the namespace's
init is what makes it immune to signals from the commands it starts (see agent.c). Its
listening socket is created by the node, bound at ``agent.sock`` and handed over as fd 3, so
the node can be killed and restarted while the agent keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import time
from pathlib import Path

from dsec.api.errors import Capacity, Internal, InvalidArgument
from dsec.node.agent.client import AgentConnector, AgentPool, ping, unix_connector
from dsec.node.backends.base import Backend, Reclaim, ReclaimPlan, SandboxRecord
from dsec.node.density import cpuclass, prefetch
from dsec.node.density.reclaim import reclaim_cgroup, reclaim_running, restore_cgroup
from dsec.node.files import FileOps
from dsec.node.host import cgroups, mounts, reaper, runcns
from dsec.node.host.charged import Charge
from dsec.node.host.imagelinks import ImageLinks
from dsec.node.host.oci import ContainerConfig, build_config, mask_plan
from dsec.node.host.rooted import RootedFiles

__all__ = ["ContainerBackend"]

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LAUNCHER_EXITS = {125: "could not give runc a mount namespace of its own (see runc.log)",
                  127: "could not execute runc"}

log = logging.getLogger(__name__)


class ContainerBackend(Backend):
    """Runs sandboxes as runc containers; see the module docstring for the layout."""

    name = "container"
    protects_paths = "host"  # the agent enforces protected_paths with the host's Landlock
    cpu_classes = frozenset(cpuclass.CPU_CLASSES)
    can_reclaim = True
    memory_read_is_cheap = True  # memory.current / memory.usage_in_bytes

    def __init__(self, state_dir: Path, images, agent_binary: Path,
                 runc: str = "runc", merge: bool = False, runc_sees_host: bool = False) -> None:
        self.state_dir = state_dir
        self.images = images
        self.agent_binary = agent_binary
        self.runc = shutil.which(runc) or runc
        self.runc_root = state_dir / "runc"
        self.cgroups = cgroups.detect()
        self.merge = merge  # KSM: runc, and so the sandbox's init, start mergeable
        self.core = cpuclass.core_scheduling()
        self.image_links = ImageLinks()  # the create-time hard-link check, per image once
        self.runc_root.mkdir(parents=True, exist_ok=True)
        # bound read-only over masked /sys directories, in place of a tmpfs each (oci.py)
        self.empty_dir = state_dir / "empty"
        self.empty_dir.mkdir(exist_ok=True)
        self.empty_dir.chmod(0o555)
        # where runc finds the sandbox's directory in its own mount namespace; None: runc
        # runs in the host's and finds it where the node does
        self.bundle_at: Path | None = None
        self.own_mount = runcns.OwnMount(state_dir / "sandboxes", state_dir / "sandboxes.bind")
        if not runc_sees_host:
            if self.own_mount.ensure():
                self.bundle_at = state_dir / "bundle"
                self.bundle_at.mkdir(mode=0o700, exist_ok=True)
            else:
                log.warning("%s holds mounts of sandboxes started before it was a mount of "
                            "its own: runc sees every sandbox's mounts until none is left",
                            state_dir / "sandboxes")
        reaper.hold_subreaper()  # so the inits runc leaves behind are ours to reap
        self._closed = False
        self.agent_pool = AgentPool()  # idle agent connections, reused by the next exec

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            reaper.release_subreaper()
            if self.bundle_at is not None:  # kept while sandboxes' mounts are under it
                await asyncio.to_thread(self.own_mount.release)

    # ---- paths ----
    def sandbox_dir(self, sb_id: str) -> Path:
        return self.state_dir / "sandboxes" / sb_id

    def runc_dir(self, d: Path) -> Path:
        """The sandbox directory ``d`` as runc and the config name it: in runc's own mount
        namespace it is bound at the bundle path."""
        return d if self.bundle_at is None else self.bundle_at

    @staticmethod
    def cgroup_path(sb_id: str) -> str:
        return f"/dsec/{sb_id}"

    # ---- lifecycle ----
    async def start(self, rec: SandboxRecord) -> dict:
        d = self.sandbox_dir(rec.id)
        resolved = await asyncio.to_thread(self.images.resolve, rec.spec.image, rec.spec.layers)
        await asyncio.to_thread(self._prepare_rootfs, d, resolved.lowerdirs, rec.spec.disk_mb)
        cfg = self._config(rec, d, resolved.config)
        (d / "config.json").write_text(json.dumps(cfg))
        listener = self._listen(d / "agent.sock")
        try:
            if rec.spec.protected_paths:
                await asyncio.to_thread(self._refuse_stray_links, resolved.layer_digests,
                                        rec.spec.protected_paths, d)
            await self._runc_run(rec.id, d, listener)
        except BaseException:
            listener.close()
            await self.stop(rec)
            raise
        listener.close()
        pid = int((d / "init.pid").read_text())
        try:
            await asyncio.to_thread(self._set_cpu_class, rec, pid)
        except BaseException:
            await self.stop(rec)
            raise
        return {"dir": str(d), "init_pid": pid, "cgroup": self.cgroup_path(rec.id),
                "image_env": resolved.config.env, "image_cwd": resolved.config.cwd or "/",
                "image_user": resolved.config.user or "root",
                "layer_digests": list(resolved.layer_digests)}

    def _prepare_rootfs(self, d: Path, lowerdirs: list[Path], disk_mb: int) -> None:
        rw, rootfs = d / "rw", d / "rootfs"
        rw.mkdir(parents=True, exist_ok=True)
        rootfs.mkdir(exist_ok=True)
        mounts.mount("tmpfs", rw, "tmpfs", mounts.MS_NOSUID | mounts.MS_NODEV,
                     f"size={disk_mb}m,mode=755")
        (rw / "upper").mkdir(exist_ok=True)
        (rw / "work").mkdir(exist_ok=True)
        (rw / "shm").mkdir(exist_ok=True)
        (rw / "shm").chmod(0o1777)
        lower = ":".join(str(p) for p in lowerdirs)
        opts = f"lowerdir={lower},upperdir={rw / 'upper'},workdir={rw / 'work'}"
        if len(opts) > 4000:
            raise InvalidArgument(f"too many layers for one overlay ({len(lowerdirs)})")
        mounts.mount("overlay", rootfs, "overlay", 0, opts)

    def _refuse_stray_links(self, layer_digests: list[str], protected: list[str],
                            d: Path) -> None:
        """InvalidArgument if the image gives a protected file a name outside the protected
        paths (a hard link in a layer): agent commands could read it by that name. The
        sandbox's rootfs at ``d`` is the image unmodified (nothing ran in it yet)."""
        self.image_links.check(layer_digests, protected,
                               lambda: contextlib.nullcontext(str(d / "rootfs")))

    async def refuse_stray_links(self, rec: SandboxRecord, protected: list[str]) -> None:
        """The same check for a pooled sandbox about to become one with ``protected``
        paths (its rootfs holds only its image: nothing but the agent ran in it)."""
        await asyncio.to_thread(self._refuse_stray_links, rec.runtime["layer_digests"],
                                protected, self.sandbox_dir(rec.id))

    def _config(self, rec: SandboxRecord, d: Path, image_cfg) -> dict:
        env = {"PATH": DEFAULT_PATH, "HOSTNAME": rec.id, "HOME": "/root", "TERM": "xterm"}
        env.update(image_cfg.env or {})
        env.update(rec.spec.env)
        masked, hidden = mask_plan()
        at = self.runc_dir(d)
        return build_config(ContainerConfig(
            hostname=rec.id,
            rootfs=str(at / "rootfs"),
            args=["/.dsec/agent", "serve-fd", "3"],
            env=[f"{k}={v}" for k, v in env.items()],
            cgroups_path=self.cgroup_path(rec.id),
            cpu=rec.spec.cpu,
            memory_mb=rec.spec.memory_mb,
            pids=rec.spec.pids,
            binds=[(str(self.agent_binary), "/.dsec/agent")],
            shm_dir=str(at / "rw" / "shm"),
            masked_dirs=masked,
            hidden_dirs=hidden,
            empty_dir=str(self.empty_dir),
        ))

    @staticmethod
    def _listen(path: Path) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if path.exists():
            path.unlink()
        if len(str(path).encode()) < 100:
            s.bind(str(path))
        else:  # sun_path holds 108 bytes: bind through the directory's fd
            dirfd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                s.bind(f"/proc/self/fd/{dirfd}/{path.name}")
            finally:
                os.close(dirfd)
        os.chmod(path, 0o600)
        s.listen(512)
        return s

    async def _runc(self, *args: str, stdin_fd: int | None = None) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            self.runc, "--root", str(self.runc_root), *args,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE)
        _, err = await proc.communicate()
        return proc.returncode or 0, err.decode(errors="replace").strip()

    async def _runc_run(self, sb_id: str, d: Path, listener: socket.socket) -> None:
        # posix_spawn with a dup2 action puts the listener at fd 3 for --preserve-fds
        # without a preexec_fn (unsafe in a threaded server). The container's stdio is
        # /dev/null so nothing inside can write into a host file; runc's errors go to --log.
        # The bundle launcher's own errors go to runc.log too: it points its stderr at
        # /dev/null before it execs runc.
        log, at = d / "runc.log", self.runc_dir(d)
        args = [self.runc, "--root", str(self.runc_root), "--log", str(at / "runc.log"),
                "--log-format", "json", "run", "-d", "--preserve-fds", "1",
                "--pid-file", str(at / "init.pid"), "-b", str(at), sb_id]
        err = ("/dev/null", os.O_WRONLY) if self.bundle_at is None else \
            (str(log), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        actions = [
            (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, "/dev/null", os.O_WRONLY, 0),
            (os.POSIX_SPAWN_OPEN, 2, *err, 0o600),
            (os.POSIX_SPAWN_DUP2, listener.fileno(), 3),
        ]
        merge = ["--merge"] if self.merge else []  # the agent sets PR_SET_MEMORY_MERGE
        if self.bundle_at is not None:
            args = [str(self.agent_binary), *merge, "bundle", str(self.state_dir / "sandboxes"),
                    str(d), str(at), *args]
        elif merge:
            args = [str(self.agent_binary), *merge, "run", *args]
        pid = os.posix_spawn(args[0], args, os.environ, file_actions=actions)
        _, status = await asyncio.to_thread(os.waitpid, pid, 0)
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            msg = _last_error(log) or (LAUNCHER_EXITS.get(code, "") if args[0] != self.runc
                                       else "")
            if "cannot allocate memory" in msg or "resource temporarily unavailable" in msg:
                raise Capacity(f"node out of resources starting {sb_id}: {msg}")
            raise Internal(f"runc could not start {sb_id}: {msg or f'exit {code}'}")

    async def stop(self, rec: SandboxRecord) -> None:
        # SIGKILL to the pid namespace's init ends every process in it; done directly this
        # takes ~1 ms where `runc delete --force` takes ~100 ms. runc stays the fallback.
        d = self.sandbox_dir(rec.id)
        self.agent_pool.drop(str(d / "agent.sock"))
        emptied = await asyncio.to_thread(self._kill_all, rec)
        if not emptied and (self.runc_root / rec.id).exists():
            await self._runc("delete", "--force", rec.id)
        await asyncio.to_thread(self._teardown, rec.id, d)

    def _kill_all(self, rec: SandboxRecord, timeout: float = 5.0) -> bool:
        """Kill every process of the sandbox; True once its cgroup is empty and its init
        reaped (a zombie init is still the sandbox's, seen by ``pgrep`` and ``/proc``)."""
        cg = self.cgroup_path(rec.id)
        if not self.cgroups.exists(cg):
            return True
        pids = set(self.cgroups.procs(cg))
        init = rec.runtime.get("init_pid")
        init_fd = reaper.open_pidfd(init) if init and _belongs_to(init, rec.id) else None
        if init:
            pids.add(init)
        try:
            for pid in pids:
                if _belongs_to(pid, rec.id):
                    _kill(pid)
            emptied = self._wait_empty(cg, timeout)
        finally:
            if init_fd is not None:  # ours since runc left it (a subreaper's): reap it
                reaper.wait_reaped(init_fd, timeout)
        return emptied

    def _wait_empty(self, cg: str, timeout: float) -> bool:
        """Thaw the cgroup and kill what is left until none of it runs."""
        try:
            self.cgroups.set_frozen(cg, False)  # frozen tasks only die once thawed
        except (OSError, TimeoutError):
            pass
        deadline = time.monotonic() + timeout
        delay = 0.0005
        while self.cgroups.procs(cg):
            if time.monotonic() > deadline:
                return False
            for pid in self.cgroups.procs(cg):
                _kill(pid)
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        return True

    def _teardown(self, sb_id: str, d: Path) -> None:
        # Unmount what start() mounted by name: scanning mountinfo (thousands of lines on a
        # dense node) per stop would make a mass stop quadratic. The scan is the fallback.
        try:
            for target in (d / "rootfs", d / "rw"):
                mounts.umount(target)
        except OSError:
            for target in mounts.mounts_under(d):
                mounts.umount(target)
        if d.is_dir() and (mounts.is_mountpoint(d / "rootfs") or mounts.is_mountpoint(d / "rw")):
            for target in mounts.mounts_under(d):
                mounts.umount(target)
        self.cgroups.remove(self.cgroup_path(sb_id))
        shutil.rmtree(d, ignore_errors=True)
        shutil.rmtree(self.runc_root / sb_id, ignore_errors=True)

    async def pause(self, rec: SandboxRecord) -> None:
        await self._freeze(rec, True)

    async def resume(self, rec: SandboxRecord) -> None:
        await self._freeze(rec, False)

    async def _freeze(self, rec: SandboxRecord, frozen: bool) -> None:
        """The freezer cgroup directly (what `runc pause` does, without a process spawn)."""
        try:
            await asyncio.to_thread(self.cgroups.set_frozen, self.cgroup_path(rec.id), frozen)
        except (OSError, TimeoutError) as exc:
            verb = "pause" if frozen else "resume"
            raise Internal(f"could not {verb} {rec.id}: {exc}") from exc

    def _set_cpu_class(self, rec: SandboxRecord, init_pid: int | None) -> None:
        """Best effort: cgroup cpu.idle (+ v1 minimal shares) and SCHED_IDLE on the init
        (and its threads), which everything it starts inherits."""
        cls = rec.spec.cpu_class
        if cls == "latency" and not self.core.available \
                and not self.cgroups.cpu_idle(self.cgroup_path(rec.id)):
            return  # runc's defaults are latency class already
        cpuclass.apply(self.cgroups, self.cgroup_path(rec.id), init_pid, cls, self.core)

    # ---- density ----
    def reclaim(self, rec: SandboxRecord, plan: ReclaimPlan) -> Reclaim:
        return reclaim_cgroup(self.cgroups, self.cgroup_path(rec.id), rec.spec.memory_mb << 20,
                              plan)

    def reclaim_idle(self, rec: SandboxRecord, plan: ReclaimPlan) -> Reclaim:
        return reclaim_running(self.cgroups, self.cgroup_path(rec.id),
                               rec.spec.memory_mb << 20, plan)

    def restore(self, rec: SandboxRecord) -> None:
        rel = self.cgroup_path(rec.id)
        restore_cgroup(self.cgroups, rel, rec.spec.memory_mb << 20)
        prefetch.prefetch(self.cgroups.procs(rel))

    async def apply_spec(self, rec: SandboxRecord) -> None:
        """Give a running (pooled) sandbox the limits of ``rec.spec``: cgroups and disk size."""
        spec = rec.spec
        rw = self.sandbox_dir(rec.id) / "rw"

        def apply() -> None:
            self.cgroups.set_limits(self.cgroup_path(rec.id), spec.cpu, spec.memory_mb, spec.pids)
            self._set_cpu_class(rec, rec.runtime.get("init_pid"))
            mounts.mount("tmpfs", rw, "tmpfs",
                         mounts.MS_REMOUNT | mounts.MS_NOSUID | mounts.MS_NODEV,
                         f"size={spec.disk_mb}m")
        try:
            await asyncio.to_thread(apply)
        except OSError as exc:
            raise Internal(f"could not apply limits to {rec.id}: {exc}") from exc

    async def alive(self, rec: SandboxRecord) -> bool:
        state = self.runc_root / rec.id / "state.json"
        pid = rec.runtime.get("init_pid")
        if not state.exists() or not pid:
            return False
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        if stat.rpartition(")")[2].split()[0] in ("Z", "X"):  # a zombie nobody reaped yet
            return False
        if rec.state == "paused":
            return True  # frozen: the agent cannot answer until resumed
        return await ping(self.connector(rec), timeout=5.0)

    # ---- access ----
    def connector(self, rec: SandboxRecord) -> AgentConnector:
        return unix_connector(str(self.sandbox_dir(rec.id) / "agent.sock"), self.agent_pool)

    def files(self, rec: SandboxRecord) -> FileOps:
        charge = Charge(self.cgroups, self.cgroup_path(rec.id), rec.spec.memory_mb,
                        rec.spec.disk_mb)
        d = self.sandbox_dir(rec.id)
        return RootedFiles(str(d / "rootfs"), charge, shm=str(d / "rw" / "shm"))

    def oom_kills(self, rec: SandboxRecord) -> int:
        return self.cgroups.oom_kills(self.cgroup_path(rec.id))

    def memory_bytes(self, rec: SandboxRecord) -> int:
        return self.cgroups.memory_bytes(self.cgroup_path(rec.id))

    def upper_dir(self, rec: SandboxRecord) -> Path:
        return self.sandbox_dir(rec.id) / "rw" / "upper"

    async def pack_diff(self, rec: SandboxRecord, tag: str, exclude: list[str]):
        """Pack the writable layer, frozen meanwhile for a consistent snapshot."""
        base = await asyncio.to_thread(self.images.resolve, rec.spec.image, rec.spec.layers)
        await self._freeze(rec, True)
        try:
            return await asyncio.to_thread(self.images.pack_diff, self.upper_dir(rec), tag,
                                           base, exclude)
        finally:
            await self._freeze(rec, False)


def _belongs_to(pid: int, sb_id: str) -> bool:
    """Guard against pid reuse: the process must sit in the sandbox's cgroup."""
    try:
        return sb_id in Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return False


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _last_error(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("level") in ("error", "fatal"):
            return str(rec.get("msg", ""))
    return lines[-1] if lines else ""
