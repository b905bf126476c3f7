"""Exec round trip of `true`: SDK + HTTP beside runc exec, nsenter and the bare agent.

All paths run on the same sandbox in the same run, interleaved in rounds so that load from
other users of the machine falls on every path alike. Target (issue 2): SDK p50 <= 3 ms.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time

import common

import dsec
from dsec.node.agent.client import AgentProcess, SpawnRequest, unix_connector


async def agent_true(sock: str) -> None:
    proc = await AgentProcess.start(unix_connector(sock), SpawnRequest(argv=["true"],
                                                                        env={"PATH": "/bin"}))
    proc.close_stdin()
    while (await proc.next_event())[0] != "exit":
        pass
    if proc.exit_code != 0:
        raise RuntimeError(f"agent: true exited {proc.exit_code}")


class RawHTTP:
    """HTTP/1.1 by hand over one kept-alive connection: the server's share, no client library."""

    def __init__(self, port: int, token: str) -> None:
        self.port, self.token = port, token

    async def open(self) -> RawHTTP:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        return self

    async def post(self, path: str, body: dict) -> dict:
        data = json.dumps(body).encode()
        self.writer.write(f"POST {path} HTTP/1.1\r\nHost: bench\r\n"
                          f"Authorization: Bearer {self.token}\r\n"
                          f"Content-Type: application/json\r\n"
                          f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        head = await self.reader.readuntil(b"\r\n\r\n")
        length = next(int(ln.split(b":")[1]) for ln in head.split(b"\r\n")
                      if ln.lower().startswith(b"content-length:"))
        return json.loads(await self.reader.readexactly(length))

    def close(self) -> None:
        self.writer.close()


def run_true(argv: list[str]) -> None:
    subprocess.run(argv, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


async def main(quick: bool) -> None:
    rounds, per_round = (3, 5) if quick else (10, 50)  # 500 SDK calls in the full run
    slow_per_round = 2 if quick else 10                  # runc exec costs ~10x more
    warmup = 5 if quick else 50
    with common.server() as srv:
        runc_root = str(srv.state_dir / "runc")
        async with dsec.AsyncClient(srv.url, srv.token) as client:
            sb = await client.create(memory_mb=256)
            try:
                state = json.loads(common.sh("runc", "--root", runc_root, "state", sb.id).stdout)
                pid = str(state["pid"])
                sock = str(srv.state_dir / "sandboxes" / sb.id / "agent.sock")
                sync_client = dsec.Client(srv.url, srv.token)
                sync_sb = sync_client.get(sb.id)

                async def sdk_async():
                    r = await sb.exec(["true"])
                    assert r.exit_code == 0, r

                async def sdk_async_shell():
                    r = await sb.exec("true")
                    assert r.exit_code == 0, r

                async def sdk_sync():
                    r = sync_sb.exec(["true"])
                    assert r.exit_code == 0, r

                raw = await RawHTTP(srv.port, srv.token).open()

                async def raw_http():
                    r = await raw.post(f"/v1/sandboxes/{sb.id}/exec", {"cmd": ["true"]})
                    assert r["exit_code"] == 0, r

                async def http_floor():
                    await sb.refresh()

                async def agent():
                    await agent_true(sock)

                async def runc_exec():
                    run_true(["runc", "--root", runc_root, "exec", sb.id, "true"])

                async def nsenter():
                    run_true(["nsenter", "-t", pid, "-a", "true"])

                paths = {
                    "SDK AsyncClient + HTTP, argv `[\"true\"]`": (sdk_async, per_round),
                    "SDK AsyncClient + HTTP, shell string `\"true\"`": (sdk_async_shell,
                                                                        per_round),
                    "SDK sync Client + HTTP, argv": (sdk_sync, per_round),
                    "hand-written HTTP/1.1 on a kept-alive socket (no SDK, no httpx)": (
                        raw_http, per_round),
                    "SDK `sb.refresh()` (HTTP + auth + route, no exec)": (http_floor,
                                                                          per_round),
                    "node→agent only (unix socket, no HTTP)": (agent, per_round),
                    "`nsenter -t <init> -a true`": (nsenter, per_round),
                    "`runc exec <id> true` (baseline)": (runc_exec, slow_per_round),
                }
                for fn, _ in paths.values():
                    for _ in range(warmup if fn is not runc_exec else 3):
                        await fn()
                samples: dict[str, list[float]] = {k: [] for k in paths}
                for _ in range(rounds):
                    for name, (fn, n) in paths.items():
                        for _ in range(n):
                            t0 = time.perf_counter()
                            await fn()
                            samples[name].append(time.perf_counter() - t0)
                sync_client.close()
                raw.close()
            finally:
                await sb.stop()
    left = srv.left

    base = common.percentile(samples["`runc exec <id> true` (baseline)"], 50)
    nsent = common.percentile(samples["`nsenter -t <init> -a true`"], 50)
    rows = []
    for name, xs in samples.items():
        s = common.summary(xs)
        rows.append([name, s["n"], common.fmt_ms(s["p50"]), common.fmt_ms(s["p90"]),
                     common.fmt_ms(s["mean"]), common.ratio(s["p50"], base),
                     common.ratio(s["p50"], nsent)])
    sdk_p50 = common.percentile(samples["SDK AsyncClient + HTTP, argv `[\"true\"]`"], 50)
    verdict = "met" if sdk_p50 <= 0.003 else "NOT met"
    body = common.table(["path", "n", "p50 ms", "p90 ms", "mean ms", "p50 / runc exec",
                         "p50 / nsenter"], rows)
    notes = [f"Target: SDK exec p50 ≤ 3 ms — {verdict} ({common.fmt_ms(sdk_p50)} ms).",
             f"Sequential calls, {rounds} interleaved rounds; one sandbox (busybox, 256 MiB).",
             "Cleanup after stop: " + ("nothing left" if not left else ", ".join(left))]
    name = "exec-quick" if quick else "exec"
    common.publish(name, "Exec round trip of `true`" + (" (quick)" if quick else ""), body,
                   notes)
    if left:
        raise SystemExit(f"leftovers: {left}")


if __name__ == "__main__":
    args = common.parse_args(__doc__)
    asyncio.run(main(args.quick))
