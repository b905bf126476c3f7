"""What the gateway's request-id and /docs middleware cost per request, in process.

The same trivial ASGI app is called bare and behind ``RequestIds`` + ``DocsPages`` (the
two layers issue 14 added in front of every route), in interleaved rounds so that other
load on the machine falls on both alike. Only successful requests, which are not logged
(the default); a failed one adds its JSON log line, measured as a third column.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time

import common

from dsec.gateway import logs
from dsec.gateway.logs import RequestIds
from dsec.gateway.openapi import DocsPages

SCOPE = {"type": "http", "method": "POST", "path": "/v1/sandboxes/sb-x/exec",
         "headers": [(b"authorization", b"Bearer x"), (b"content-type", b"application/json")]}


def _app(status: int):
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b"{}"})
    return app


async def _receive():
    return {"type": "http.request", "body": b"{}"}


async def _send(msg):
    pass


async def _per_request_us(app, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        await app(SCOPE, _receive, _send)
    return (time.perf_counter() - t0) / n * 1e6


async def main(rounds: int, n: int) -> None:
    logs.configure(logging.INFO)
    logging.getLogger().handlers[0].stream = open("/dev/null", "w")  # the line's cost, not a tty's
    bare, wrapped = _app(200), RequestIds(DocsPages(_app(200)))
    failed = RequestIds(DocsPages(_app(404)))
    got: dict[str, list[float]] = {"bare": [], "wrapped": [], "failed": []}
    for _ in range(rounds):
        got["bare"].append(await _per_request_us(bare, n))
        got["wrapped"].append(await _per_request_us(wrapped, n))
        got["failed"].append(await _per_request_us(failed, n))
    med = {k: statistics.median(v) for k, v in got.items()}
    rows = [["bare ASGI app (baseline)", f"{med['bare']:.1f}", "-"],
            ["behind RequestIds + DocsPages, 200", f"{med['wrapped']:.1f}",
             f"+{med['wrapped'] - med['bare']:.1f}"],
            ["behind RequestIds + DocsPages, 404 (logged)", f"{med['failed']:.1f}",
             f"+{med['failed'] - med['bare']:.1f}"]]
    common.publish("request_ids", "Request ids and /docs: middleware cost per request",
                   common.table(["path", "µs per request (median of rounds)", "added µs"],
                                rows),
                   [f"{rounds} rounds of {n} requests each, interleaved; in process, no "
                    "socket (what the layers add to a request's CPU, not its latency)",
                    "the exec round trip these ride on is about 2-3 ms (`## Exec round trip`)"])


if __name__ == "__main__":
    args = common.parse_args(__doc__)
    asyncio.run(main(5 if args.quick else 21, 2000 if args.quick else 20000))
