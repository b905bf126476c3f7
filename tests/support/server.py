"""A real dsec server in a subprocess on a loopback port, for tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

__all__ = ["ServerProcess", "free_port", "leftovers"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """Start with :meth:`start`; ``url``, ``token`` and ``state_dir`` describe it."""

    def __init__(self, state_dir: Path | None = None, port: int | None = None,
                 backends: list[str] | None = None, extra_args: list[str] | None = None) -> None:
        self.state_dir = state_dir or Path(tempfile.mkdtemp(prefix="dsec-test-"))
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.backends = backends or ["container"]
        self.extra_args = extra_args or []
        self.proc: subprocess.Popen | None = None
        self.token = ""

    def start(self, timeout: float = 120.0) -> ServerProcess:
        cmd = [sys.executable, "-m", "dsec.gateway.server", "--state-dir", str(self.state_dir),
               "--port", str(self.port)]
        for b in self.backends:
            cmd += ["--backend", b]
        cmd += self.extra_args
        self.log = open(self.state_dir / "server.log", "ab")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.tail()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        else:
            raise RuntimeError(f"server did not start: {self.tail()}")
        self.token = (self.state_dir / "token").read_text().strip()
        return self

    def tail(self) -> str:
        try:
            return (self.state_dir / "server.log").read_text()[-3000:]
        except OSError:
            return ""

    def env(self) -> dict[str, str]:
        return {**os.environ, "DSEC_URL": self.url, "DSEC_TOKEN": self.token,
                "DSEC_STATE_DIR": str(self.state_dir)}

    def kill(self) -> None:
        """SIGKILL, as a crash would: sandboxes keep running."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()

    def stop_all_sandboxes(self) -> None:
        headers = {"authorization": f"Bearer {self.token}"}
        with httpx.Client(base_url=self.url, headers=headers, timeout=120) as c:
            for sb in c.get("/v1/sandboxes").json()["sandboxes"]:
                c.delete(f"/v1/sandboxes/{sb['id']}")

    def destroy(self) -> None:
        """Stop every sandbox, the server, unmount layers and remove the state dir."""
        try:
            if self.proc and self.proc.poll() is None:
                self.stop_all_sandboxes()
        finally:
            self.stop()
            from dsec.images import ImageService
            from dsec.node.host.mounts import mounts_under, umount
            ImageService(self.state_dir).unmount_all()
            for target in mounts_under(self.state_dir):  # e.g. a lazy-loading FUSE mount,
                umount(target)                          # whose daemon ends with it
            subprocess.run(["rm", "-rf", str(self.state_dir)], check=False)


def leftovers(state_dir: Path) -> list[str]:
    """Mounts, runc containers and cgroups that a state dir's sandboxes left behind."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        target = line.split(" ")[4]  # the directory's own mount is the node's (runcns.py)
        if target.startswith(str(state_dir / "sandboxes") + "/"):
            found.append(f"mount {target}")
    runc_root = state_dir / "runc"
    if runc_root.is_dir():
        found += [f"runc {p.name}" for p in runc_root.iterdir()]
    sb_dir = state_dir / "sandboxes"
    if sb_dir.is_dir():
        found += [f"dir {p.name}" for p in sb_dir.iterdir()]
    db = state_dir / "node.db"
    if db.exists():
        from dsec.node.store import NodeStore
        store = NodeStore(db)
        short = (store.meta("node_id") or "node-?").removeprefix("node-")
        store.close()
        found += [f"cgroup {p}" for p in Path("/sys/fs/cgroup").glob(f"*/dsec/sb-{short}-*")]
        found += [f"cgroup {p}" for p in Path("/sys/fs/cgroup").glob(f"dsec/sb-{short}-*")]
    return found


def cgroup_leftovers(sb_ids: list[str]) -> list[str]:
    """cgroup directories of stopped sandboxes still present in any hierarchy."""
    from dsec.node.host.cgroups import detect
    driver = detect()
    return [f"{sb}:{h}" for sb in sb_ids for h in driver.leftovers(f"/dsec/{sb}")]
