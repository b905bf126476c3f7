"""What bench_cluster.py runs on: a lean HTTP/1.1 client, and the processes of a cluster
of simulated node agents and gateways on this machine (started, driven, cleaned up)."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.support.server import free_port

__all__ = ["TOKEN", "PER_HOST", "Conn", "Pool", "get_json", "Host", "GatewayProc", "Cluster"]

TOKEN = "dsec_bench_" + secrets.token_hex(12)
PER_HOST = 20  # simulated node agents per process
PID_MAX = Path("/proc/sys/kernel/pid_max")


# ---- a lean HTTP/1.1 client ----
class Conn:
    """One kept-alive connection; ``request`` returns (status, body)."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.host, self.port = host, int(port)
        self.reader = self.writer = None

    async def _open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def request(self, method: str, path: str, body: dict | None = None
                      ) -> tuple[int, bytes]:
        data = b"" if body is None else json.dumps(body).encode()
        head = (f"{method} {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {TOKEN}\r\n"
                + ("Content-Type: application/json\r\n" if body is not None else "")
                + f"Content-Length: {len(data)}\r\n\r\n").encode()
        for attempt in (0, 1):
            try:
                if self.writer is None:
                    await self._open()
                self.writer.write(head + data)
                return await self._response()
            except (ConnectionError, asyncio.IncompleteReadError):
                self.close()
                if attempt:  # a stale kept-alive connection gets one fresh retry
                    raise
        raise AssertionError("unreachable")

    async def _response(self) -> tuple[int, bytes]:
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length, chunked = 0, False
        for line in head.split(b"\r\n")[1:]:
            k, _, v = line.partition(b":")
            k = k.strip().lower()
            if k == b"content-length":
                length = int(v)
            elif k == b"transfer-encoding" and b"chunked" in v.lower():
                chunked = True
        if not chunked:
            return status, await self.reader.readexactly(length)
        out = bytearray()
        while size := int((await self.reader.readuntil(b"\r\n")).strip(), 16):
            out += await self.reader.readexactly(size + 2)
            del out[-2:]
        await self.reader.readuntil(b"\r\n")
        return status, bytes(out)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


class Pool:
    """Idle connections per URL, shared by the workers of one measurement."""

    def __init__(self) -> None:
        self.idle: dict[str, list[Conn]] = {}

    async def request(self, url: str, method: str, path: str, body: dict | None = None):
        idle = self.idle.setdefault(url, [])
        conn = idle.pop() if idle else Conn(url)
        try:
            out = await conn.request(method, path, body)
        except BaseException:
            conn.close()
            raise
        idle.append(conn)
        return out

    def close(self) -> None:
        for conns in self.idle.values():
            for c in conns:
                c.close()
        self.idle.clear()


async def get_json(url: str, path: str):
    c = Conn(url)
    try:
        status, body = await c.request("GET", path)
    finally:
        c.close()
    return status, json.loads(body) if body else None


# ---- processes ----
class Host:
    """A process of simulated node agents, driven over its stdin/stdout."""

    def __init__(self, root: Path, index: int, nodes: int) -> None:
        self.root, self.index, self.nodes = root, index, nodes
        self.proc: asyncio.subprocess.Process | None = None
        self.urls: list[str] = []

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "dsec.cluster.simulated", "--nodes", str(self.nodes),
            "--state-dir", str(self.root / f"host{self.index}"),
            "--token-file", str(self.root / "token"),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=open(self.root / f"host{self.index}.log", "wb"), start_new_session=True,
            limit=1 << 24)
        self.urls = (await self._line())["urls"]

    async def _line(self):
        line = await asyncio.wait_for(self.proc.stdout.readline(), 120)
        if not line:
            raise RuntimeError(f"node host {self.index} ended: "
                               + (self.root / f"host{self.index}.log").read_text()[-2000:])
        return json.loads(line)

    async def ask(self, command: str):
        self.proc.stdin.write(command.encode() + b"\n")
        await self.proc.stdin.drain()
        return await self._line()

    def signal(self, sig: int) -> None:
        os.killpg(self.proc.pid, sig)

    async def quit(self) -> None:
        if self.proc.returncode is None:
            try:
                await asyncio.wait_for(self.ask("quit"), 60)
                await asyncio.wait_for(self.proc.wait(), 30)
            except Exception:  # any answer but a clean exit (garbled, late, a closed pipe):
                pass           # it is killed below, so no host outlives the run
        if self.proc.returncode is None:
            self.signal(signal.SIGKILL)
            await self.proc.wait()


class GatewayProc:
    """A gateway process over ``urls``; ``share`` (another's) makes it use that one's
    state dir, and so its control store, as gateways on one state dir do."""

    def __init__(self, root: Path, index: int, urls: list[str],
                 share: GatewayProc | None = None) -> None:
        self.dir = share.dir if share is not None else root / f"gateway{index}"
        self.dir.mkdir(mode=0o700, exist_ok=share is not None)
        for name in ("token", "cluster_token"):  # one secret as root token and the nodes'
            shutil.copy(root / "token", self.dir / name)  # credential: the load sends it
            os.chmod(self.dir / name, 0o600)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [sys.executable, "-m", "dsec.gateway.server", "--state-dir", str(self.dir),
                "--port", str(self.port)]
        for u in urls:
            args += ["--node", u]
        self.proc = subprocess.Popen(args, stdout=open(self.dir / "log", "wb"),
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.expect = len(urls)

    async def ready(self) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("gateway ended: " + (self.dir / "log").read_text()[-2000:])
            try:
                status, body = await get_json(self.url, "/healthz")
                if status == 200 and body["nodes"] == self.expect and not body["unhealthy"]:
                    return
            except OSError:
                pass
            await asyncio.sleep(0.1)
        raise RuntimeError("gateway did not see every node in time")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


class Cluster:
    """Node hosts (the last three hold one node each, the victims) and gateways."""

    def __init__(self, root: Path, nodes: int) -> None:
        self.root = root
        (root / "token").write_text(TOKEN + "\n")
        os.chmod(root / "token", 0o600)
        shared = nodes - 3
        sizes = [PER_HOST] * (shared // PER_HOST) + ([shared % PER_HOST] if shared % PER_HOST
                                                     else [])
        self.hosts = [Host(root, i, n) for i, n in enumerate(sizes + [1, 1, 1])]
        self.gateways: list[GatewayProc] = []
        self._pid_max: str | None = None  # as before start (see start)

    @property
    def victims(self) -> list[Host]:
        return self.hosts[-3:]

    @property
    def urls(self) -> list[str]:
        return [u for h in self.hosts for u in h.urls]

    async def start(self, gateways: int) -> None:
        # the node agents raise kernel.pid_max; the victims are killed, and a killed node
        # leaves it raised (as after any crash): put back in close
        self._pid_max = PID_MAX.read_text()
        await asyncio.gather(*(h.start() for h in self.hosts))
        self.gateways = [GatewayProc(self.root, i, self.urls) for i in range(gateways)]
        await asyncio.gather(*(g.ready() for g in self.gateways))

    async def ask_all(self, command: str, hosts: list[Host] | None = None) -> dict:
        out: dict = {}
        hosts = [h for h in (hosts or self.hosts) if h.proc.returncode is None]
        for got in await asyncio.gather(*(h.ask(command) for h in hosts)):
            out.update(got)
        return out

    async def clear(self) -> None:
        """Every sandbox stopped (in the node processes), and every gateway's ledger has
        given their room back (its reconcile), so one part's cleanup is not measured as
        the next part's cost: after a batch part that was 40,000 rows per gateway."""
        await self.ask_all("clear")
        deadline = time.monotonic() + 120
        for g in self.gateways:
            if g.proc.poll() is not None:
                continue
            while time.monotonic() < deadline:
                status, body = await get_json(g.url, "/v1/projects/info")
                if status == 200 and body["usage"]["sandboxes"] == 0:
                    break
                await asyncio.sleep(0.2)
            else:
                raise RuntimeError(f"gateway {g.url}: its ledger still holds sandboxes "
                                   "two minutes after they all stopped")

    async def counts(self) -> dict[str, dict[str, int]]:
        return await self.ask_all("counts")

    async def close(self) -> list[str]:
        """Everything ended; what was left behind (processes, ports)."""
        for g in self.gateways:
            g.stop()
        await asyncio.gather(*(h.quit() for h in self.hosts if h.proc is not None),
                             return_exceptions=True)
        if self._pid_max is not None and PID_MAX.read_text() != self._pid_max:
            PID_MAX.write_text(self._pid_max)
        left = [f"gateway pid {g.proc.pid}" for g in self.gateways if g.proc.poll() is None]
        left += [f"node host pid {h.proc.pid}" for h in self.hosts
                 if h.proc is not None and h.proc.returncode is None]
        for url in self.urls + [g.url for g in self.gateways]:
            host, port = url.removeprefix("http://").rsplit(":", 1)
            with socket.socket() as s:
                if s.connect_ex((host, int(port))) == 0:
                    left.append(f"port {port} still answers")
        return left
