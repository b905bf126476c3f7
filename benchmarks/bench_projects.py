"""Projects (issue 10): what authorization and quotas cost per request, and a queued burst.

The gateway is a real ``dsec.gateway.server --node URL ...`` process (its control store a
SQLite file in its state dir) over node agents whose backend is simulated (records only:
``dsec.node.backends.simulated``; real containers would measure runc, not the gateway),
each serving its real node API over loopback HTTP. The load comes from the SDK in this
process.

1. Per request, side by side in one run, interleaved: create, exec ``true`` and stop with
   the root token (an HMAC compare, the path of a server without projects, except that a
   root create still takes its ledger row) and with a user token of a project two levels
   down with a quota (a token lookup, a role check, the quota of every level). The added
   cost is the difference of p50s; the ledger's share of a create (reserve, and the
   confirmation the gateway writes with its next transaction) and of a stop (release),
   which the root path pays too, is timed alone on a store like the gateway's in this
   process, with the gateway's deferred confirmations.
2. A burst of 2,000 creates with ``wait_s=30`` against a project quota of 500: each
   sandbox is stopped ``--hold`` seconds after its create answers. The nodes' own records
   of the project are counted every 20 ms; every request must be answered, and those that
   waited should be served in the order they were sent. Two measures of that order:
   the gateway's own count of admissions granted while an earlier create of the project
   still waited (``dsec_gateway_admissions_out_of_order_total`` on its /metrics, before
   and after the burst; must be 0), and end to end, when the answer reaches the SDK:
   after admission each create is still placed on one of the nodes, all at once, so
   answers of creates admitted within a few ms of each other come back in the order
   their node round trips end.
3. The same burst split over two gateway processes sharing one control store (a second
   gateway on the first one's state dir; creates sent alternately to each, each stopped
   through the gateway that made it): the order count summed over both gateways (a grant
   on one that passes a waiter of the other counts), and the nodes' peak.
"""

from __future__ import annotations

import asyncio
import bisect
import math
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import common
from cluster_parts import TOKEN, GatewayProc, Host

import httpx
from prometheus_client.parser import text_string_to_metric_families

import dsec

NODES = 4
SPEC = {"cpu": 0.05, "memory_mb": 64}


def p50_ms(xs: list[float]) -> float:
    return statistics.median(xs) * 1000


async def per_request(url: str, n: int) -> dict:
    """p50 of create, exec and stop with the root token and with a project token."""
    async with dsec.AsyncClient(url, TOKEN) as root:
        await root.projects.create("bench", quota=dsec.Quota(sandboxes=100_000, cpu=100_000))
        await root.projects.create("bench/a", quota=dsec.Quota(sandboxes=50_000))
        user = await root.projects.create_token("bench/a", role="user")
        async with dsec.AsyncClient(url, user) as proj:
            times = {(arm, verb): [] for arm in ("root", "project")
                     for verb in ("create", "exec", "stop")}
            for i in range(n + 20):
                for arm, c in (("root", root), ("project", proj))[:: 1 if i % 2 else -1]:
                    t0 = time.perf_counter()
                    sb = await c.create(**SPEC)
                    t1 = time.perf_counter()
                    await sb.exec("true")
                    t2 = time.perf_counter()
                    await sb.stop()
                    t3 = time.perf_counter()
                    if i >= 20:  # warm-up left out
                        times[arm, "create"].append(t1 - t0)
                        times[arm, "exec"].append(t2 - t1)
                        times[arm, "stop"].append(t3 - t2)
    return {k: p50_ms(v) for k, v in times.items()}


async def _admit_alone(p, n: int) -> tuple[list[float], list[float]]:
    """A create's admission as the gateway runs it (its group commit of one), with and
    without the shared line's two reads (is an earlier ticket waiting in the store; the
    order check's own look), interleaved in rounds; nobody waiting."""
    from dsec.gateway.projects import admission as module
    from dsec.gateway.projects.quota import Ask
    line, real_check = p.admission.line, module.earlier_elsewhere_in
    times: tuple[list[float], list[float]] = ([], [])
    for r in range(2 * (n // 500)):
        on = r % 2 == 0
        # off: what admission cost before the shared line (no look at the store's line)
        line.earliest_in = line.earliest_in if on else (lambda path, before: None)
        module.earlier_elsewhere_in = real_check if on else (lambda *a: False)
        for _ in range(500):
            t0 = time.perf_counter()
            res = await p.admission.admit("bench/a", Ask(1, 0.05, 64), 0)
            times[0 if on else 1].append(time.perf_counter() - t0)
            p.ledger.release(res.keys)
        del line.earliest_in
        module.earlier_elsewhere_in = real_check
    return times


async def ledger_alone(n: int) -> dict:
    """The store's share, timed alone: token lookup, a create's reserve + confirm and a
    stop's release, on a fresh store file like the gateway's (confirmations deferred to
    the next write transaction, as a gateway with a running loop does)."""
    from dsec.gateway.projects import Projects
    from dsec.gateway.projects.quota import Ask
    d = Path(tempfile.mkdtemp(prefix="dsec-bench-projects-"))
    try:
        p = Projects("root", d / "projects.db")
        p.ledger.defer = lambda: None  # the next write (the stop's) writes the confirmation
        p.store.create("bench", dsec.Quota(sandboxes=10**6))
        p.store.create("bench/a", dsec.Quota(sandboxes=10**5))
        header = f"Bearer {p.store.create_token('bench/a', 'user', None).token}".encode()
        auth, admit, release = [], [], []
        for i in range(n):
            t0 = time.perf_counter()
            p.authenticate(header)
            t1 = time.perf_counter()
            res = p.ledger.reserve("bench/a", p.store.quotas(["", "bench", "bench/a"]),
                                   Ask(1, 0.05, 64))
            p.ledger.confirm([(res.keys[0], f"sb-x-{i}", "node-x")])
            t2 = time.perf_counter()
            p.ledger.stopped(f"sb-x-{i}")
            t3 = time.perf_counter()
            auth.append(t1 - t0)
            admit.append(t2 - t1)
            release.append(t3 - t2)
        with_line, without = await _admit_alone(p, n)
        p.conn.close()
        return {"auth": p50_ms(auth), "ledger": p50_ms(admit), "release": p50_ms(release),
                "admit": p50_ms(with_line), "admit_before": p50_ms(without)}
    finally:
        shutil.rmtree(d)


async def admissions(urls: list[str], project: str) -> tuple[float, float]:
    """The gateways' (admissions, of which out of arrival order) for ``project``, summed."""
    got = [await _admissions(u, project) for u in urls]
    return sum(g[0] for g in got), sum(g[1] for g in got)


async def _admissions(url: str, project: str) -> tuple[float, float]:
    async with httpx.AsyncClient(base_url=url, timeout=30,
                                 headers={"authorization": f"Bearer {TOKEN}"}) as http:
        r = await http.get("/metrics")
    r.raise_for_status()
    got = {s.name: s.value for f in text_string_to_metric_families(r.text)
           for s in f.samples if s.labels.get("project") == project}
    return (got.get("dsec_gateway_admissions_total", 0.0),
            got.get("dsec_gateway_admissions_out_of_order_total", 0.0))


async def burst(urls: list[str], host: Host, total: int, quota: int, hold_s: float,
                project: str = "burst") -> dict:
    """``total`` creates sent 0.5 ms apart, the i-th to ``urls[i % len(urls)]``."""
    async with dsec.AsyncClient(urls[0], TOKEN) as root:
        await root.projects.create(project, quota=dsec.Quota(sandboxes=quota))
        token = await root.projects.create_token(project, role="user")
    n_clients = (total // 200 + 1) // len(urls) * len(urls) or len(urls)
    clients = [dsec.AsyncClient(urls[k % len(urls)], token, timeout=120)
               for k in range(n_clients)]
    # connections opened first, as a trainer's long-lived client has them: 2,000 fresh
    # connects complete in no set order, and the burst would measure that order instead
    per = -(-total // len(clients))
    await asyncio.gather(*(c.projects.get(project) for c in clients for _ in range(per)))
    sent: dict[int, float] = {}
    served: dict[int, float] = {}
    errors: list[str] = []
    peak = [0]
    done = asyncio.Event()

    async def sample() -> None:  # the nodes' own records, not the gateway's ledger
        while not done.is_set():
            counts = await host.ask("sandboxes")
            peak[0] = max(peak[0], sum(counts.values()))
            await asyncio.sleep(0.02)

    async def one(i: int) -> None:
        c = clients[i % len(clients)]
        sent[i] = time.monotonic()
        try:
            sb = await c.create(wait_s=30, **SPEC)
        except dsec.DSecError as exc:
            errors.append(f"{exc.code}: {exc.message[:120]}")
            return
        served[i] = time.monotonic()
        await asyncio.sleep(hold_s)
        await sb.stop()

    before = await admissions(urls, project)
    sampler = asyncio.create_task(sample())
    t0 = time.monotonic()
    tasks = []
    for i in range(total):  # sent in a known order, 0.5 ms apart
        tasks.append(asyncio.create_task(one(i)))
        await asyncio.sleep(0.0005)
    await asyncio.gather(*tasks)
    wall = time.monotonic() - t0
    done.set()
    await sampler
    for c in clients:
        await c.close()
    after = await admissions(urls, project)
    granted, out_of_order = after[0] - before[0], after[1] - before[1]
    waited = sorted((i for i in served if served[i] - sent[i] > 0.05), key=lambda i: sent[i])
    pairs = inverted = 0
    for a, b in zip(waited, waited[1:]):  # neighbours in send order
        if sent[b] - sent[a] >= 0.0005:
            pairs += 1
            inverted += served[b] < served[a]
    far = _overtaken(waited, sent, served, 0.05)
    waits = [served[i] - sent[i] for i in served]
    return {"total": total, "granted": granted, "out_of_order": out_of_order,
            "far": far, "answered": len(served) + len(errors), "made": len(served), "errors": errors,
            "peak": peak[0], "wall": wall, "waited": len(waited), "pairs": pairs,
            "inverted": inverted, "wait_p50": statistics.median(waits),
            "wait_max": max(waits)}


def _overtaken(waited: list[int], sent: dict, served: dict, gap_s: float) -> int:
    """How many of ``waited`` (in send order) were served after a request sent at least
    ``gap_s`` later: overtaking beyond the jitter of HTTP and placement."""
    times = [sent[i] for i in waited]
    later_min = [math.inf] * (len(waited) + 1)  # earliest serving among waited[k:]
    for k in range(len(waited) - 1, -1, -1):
        later_min[k] = min(later_min[k + 1], served[waited[k]])
    return sum(later_min[bisect.bisect_left(times, times[j] + gap_s)] < served[i]
               for j, i in enumerate(waited))


async def run(quick: bool, hold_s: float) -> tuple[str, list[str]]:
    root = Path(tempfile.mkdtemp(prefix="dsec-bench-projects-"))
    (root / "token").write_text(TOKEN + "\n")
    os.chmod(root / "token", 0o600)
    host = Host(root, 0, NODES)
    gw = gw2 = None
    notes: list[str] = []
    try:
        await host.start()
        gw = GatewayProc(root, 0, host.urls)
        await gw.ready()
        n = 100 if quick else 1000
        per = await per_request(gw.url, n)
        alone = await ledger_alone(2000 if quick else 20000)
        total, quota = (400, 100) if quick else (2000, 500)
        b = await burst([gw.url], host, total, quota, hold_s)
        await host.ask("clear")
        gw2 = GatewayProc(root, 1, host.urls, share=gw)
        await gw2.ready()
        b2 = await burst([gw.url, gw2.url], host, total, quota, hold_s, "burst2")
    finally:
        for g in (gw, gw2):
            if g is not None:
                g.stop()
        await host.quit()
        shutil.rmtree(root, ignore_errors=True)
    rows = []
    for verb in ("create", "exec", "stop"):
        r, p = per["root", verb], per["project", verb]
        rows.append([verb, f"{r:.3f} ms", f"{p:.3f} ms", f"{(p - r) * 1000:+.0f} µs"])
    body = common.table(["p50 per request (n=%d each)" % n, "root token (open path)",
                         "project token, quota at 3 levels", "added"], rows)
    body += "\n\n" + common.table(
        ["alone, in process (p50)", "cost"],
        [["token check (SHA-256, the store's generation read, the cached caller)",
          f"{alone['auth'] * 1000:.0f} µs"],
         ["create's ledger: quotas (cached) + reserve (1 write transaction) + confirm "
          "(in memory)", f"{alone['ledger'] * 1000:.0f} µs"],
         ["stop's ledger: release (1 write transaction, with the waiting confirmation)",
          f"{alone['release'] * 1000:.0f} µs"],
         ["create's admission as the gateway runs it (group commit of one, nobody "
          "waiting), without the shared line's reads (as before it)",
          f"{alone['admit_before'] * 1000:.0f} µs"],
         ["the same with them (an earlier ticket in the store? the order check's look)",
          f"{alone['admit'] * 1000:.0f} µs "
          f"({(alone['admit'] - alone['admit_before']) * 1000:+.0f} µs)"]])
    line_cost = alone["admit"] - alone["admit_before"]
    added_create = per["project", "create"] - per["root", "create"] + alone["ledger"] \
        + line_cost
    added_exec = per["project", "exec"] - per["root", "exec"]
    added_stop = per["project", "stop"] - per["root", "stop"] + alone["release"]
    notes.append(f"added per create (difference + the ledger and the shared line's reads, "
                 f"which the root path also pays): "
                 f"{added_create * 1000:.0f} µs; per exec: {added_exec * 1000:.0f} µs; "
                 f"per stop: {added_stop * 1000:.0f} µs; target ≤ 200 µs p50 (create, "
                 f"exec): {'met' if max(added_create, added_exec) <= 0.2 else 'NOT met'}")
    for title, x in ((f"burst: {total} creates, wait_s=30, quota {quota}, each held "
                      f"{hold_s:g} s", b),
                     (f"the same burst split over 2 gateways sharing one projects.db", b2)):
        body += "\n\n" + _burst_table(title, x, quota)
    if b["errors"] or b2["errors"]:
        notes.append("errors: " + "; ".join(sorted(set(b["errors"] + b2["errors"]))[:3]))
    notes.append("simulated backend (records only): real containers would measure runc, "
                 "not the gateway")
    return body, notes


def _burst_table(title: str, b: dict, quota: int) -> str:
    return common.table(
        [title, "value"],
        [["answered", f"{b['answered']} of {b['total']} ({b['made']} made, "
                      f"{len(b['errors'])} errors)"],
         ["most sandboxes of the project at once (nodes' records, every 20 ms)",
          f"{b['peak']} (quota {quota})"],
         ["admissions granted while an earlier create of the project still waited, on "
          "its gateway or (shared line) another (the gateways' counts, /metrics, summed)",
          f"{b['out_of_order']:.0f} of {b['granted']:.0f} admissions"],
         ["requests that waited (end to end, > 50 ms)", str(b["waited"])],
         ["of those, neighbours in send order (≥ 0.5 ms apart) served out of order",
          f"{b['inverted']} of {b['pairs']}"],
         ["of those, answered after one sent ≥ 50 ms later (admission, then placement)",
          f"{b['far']} of {b['waited']}"],
         ["wait p50 / max", f"{b['wait_p50']:.2f} s / {b['wait_max']:.2f} s"],
         ["wall time", f"{b['wall']:.1f} s"]])


def main() -> None:
    args = common.parse_args(__doc__, lambda p: p.add_argument(
        "--hold", type=float, default=1.0, help="seconds each burst sandbox is kept"))
    body, notes = asyncio.run(run(args.quick, args.hold))
    name = "projects-quick" if args.quick else "projects"
    common.publish(name, "Projects: authorization and quota cost; a queued burst", body, notes)


if __name__ == "__main__":
    main()
