"""What writing a gateway's kept ledger rows costs its loop, per sandbox.

A create in a project nothing bounds keeps its reservation and, once the node answers,
its confirmation in memory; the gateway writes them with its next write transaction or
within ``FLUSH_S`` (``Ledger.flush``, on the gateway's event loop). Measured on a real
SQLite control store (the gateway's own ``projects.db``, WAL): 30 single creates per
write (what ~600 creates/s gives in 50 ms) and one batch of 32,000, written by
``Ledger.flush`` (now: a row taken and confirmed since the last write is inserted once,
with its sandbox, in set-wise statements) against the baseline, the same rows written as
the ledger wrote them before (insert each reservation, then per confirmation a lookup of
its sandbox and an update of its row). CPU time of this process, medians of interleaved
rounds; each round starts from a fresh store.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import common

from dsec.gateway.projects import Projects
from dsec.gateway.projects.db import write
from dsec.gateway.projects.quota import Ask


def _kept(p: Projects, writes: int, per: int, base: int) -> None:
    """Reservations and confirmations of ``writes`` creates of ``per`` sandboxes, kept."""
    for i in range(writes):
        res = p.ledger.take_unbounded("job", Ask(per, 0.05, 64))
        p.ledger.confirm([(k, f"sb-{base + i * per + j:08x}", "node-a")
                          for j, k in enumerate(res.keys)])


def _row_by_row(p: Projects) -> None:
    """The baseline: the kept rows written one statement per row, as before."""
    led = p.ledger
    takes, led._takes = led._takes, []
    confirms, led._confirms = led._confirms, []
    with write(p.conn):
        for path, ask, keys, at in takes:
            p.conn.executemany("INSERT INTO held (key, path, cpu, memory_mb, at) "
                               "VALUES (?, ?, ?, ?, ?)",
                               [(k, path, ask.cpu, ask.memory_mb, at) for k in keys])
            led._add(path, len(keys), ask.cpu * len(keys), ask.memory_mb * len(keys))
        for key, sb, node, at in confirms:
            if p.conn.execute("SELECT 1 FROM held WHERE sb_id = ?", (sb,)).fetchone():
                led._drop("key = ?", [key])
            else:
                p.conn.execute("UPDATE held SET sb_id = ?, node = ?, at = ? WHERE key = ?",
                               (sb, node, at, key))


def one_round(how: str, writes: int, per: int, repeat: int) -> float:
    """CPU seconds per sandbox written, over ``repeat`` writes into one store."""
    with tempfile.TemporaryDirectory() as d:
        p = Projects("root-token", Path(d) / "projects.db")
        p.ledger.defer = lambda: None  # as a gateway's loop: kept until the write
        spent = 0.0
        for r in range(repeat):
            _kept(p, writes, per, r * writes * per)
            t = time.process_time()
            _row_by_row(p) if how == "baseline" else p.ledger.flush()
            spent += time.process_time() - t
        n = writes * per * repeat
        assert p.conn.execute("SELECT count(*), count(sb_id) FROM held").fetchone() == (n, n)
        assert p.store.usage("job").sandboxes == n
        p.conn.close()
        return spent / n


def main(rounds: int, batch: int) -> None:
    cases = [("30 single creates per write", 30, 1, 100),
             (f"one batch of {batch:,}", 1, batch, 1)]
    rows = []
    for label, writes, per, repeat in cases:
        got: dict[str, list[float]] = {"baseline": [], "now": []}
        for _ in range(rounds):
            for how in got:
                got[how].append(one_round(how, writes, per, repeat))
        base, now = (statistics.median(got[h]) for h in ("baseline", "now"))
        held = writes * per
        rows.append([label, f"{base * 1e6:.1f}", f"{now * 1e6:.1f}",
                     common.fmt_ms(base * held), common.fmt_ms(now * held),
                     common.ratio(now, base)])
    common.publish("ledger_writes", "Writing kept ledger rows: the gateway loop's CPU",
                   common.table(["write", "baseline µs / sandbox", "now µs / sandbox",
                                 "baseline ms / write", "now ms / write", "now vs baseline"],
                                rows),
                   [f"medians of {rounds} interleaved rounds; CPU time (process_time) of the "
                    "write transaction only; a real SQLite store in a temporary directory "
                    "(WAL, as the gateway opens it); one project, one node",
                    "baseline: each reservation inserted, then per confirmation a lookup of "
                    "its sandbox (a retried request_id) and an update of its row; now: "
                    "`Ledger.flush` (one insert per sandbox with its id, one lookup per "
                    "1,000 sandboxes)"])


if __name__ == "__main__":
    args = common.parse_args(__doc__)
    main(3 if args.quick else 7, 2000 if args.quick else 32000)
