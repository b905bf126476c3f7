"""How long a gateway's loop is held when a node's thousands of sandboxes ended at once.

A 32,000-sandbox job stopped on a node leaves 32,000 rows in the project ledger until the
gateway's reconcile drops them. Measured on a real SQLite control store (the gateway's own
``projects.db``): the whole reconcile in one go, one transaction (``Ledger.reconcile``, the
baseline: how the gateway's loop ran it before, though with this tree's one sum update per
project instead of one per row) against the steps the gateway takes now, one chunk per
transaction (``gone`` / ``drop_gone``), reporting the longest step (what one request can
wait behind) and the total. Rounds interleaved; each starts from a fresh store.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import common

from dsec.gateway.projects import Projects
from dsec.gateway.projects.ledger import CHUNK, chunks
from dsec.gateway.projects.quota import Ask


def _filled(d: Path, n: int) -> Projects:
    p = Projects("root-token", d / "projects.db")
    keys: list[str] = []
    while len(keys) < n:
        keys += p.ledger.reserve("job", {}, Ask(min(1000, n - len(keys)), 0.05, 64),
                                 partial=True).keys
    p.ledger.confirm([(k, f"sb-{i}", "node-a") for i, k in enumerate(keys)])
    p.ledger.flush()
    return p


def one_go(n: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as d:
        p = _filled(Path(d), n)
        t = time.perf_counter()
        p.ledger.reconcile("node-a", {}, time.time() + 1)
        took = time.perf_counter() - t
        assert p.store.usage("").sandboxes == 0
        p.conn.close()
        return took, took


def stepped(n: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as d:
        p = _filled(Path(d), n)
        t0 = t = time.perf_counter()
        gone = p.ledger.gone("node-a", {}, time.time() + 1)
        longest = time.perf_counter() - t
        for part in chunks(gone):
            t = time.perf_counter()
            p.ledger.drop_gone(part)
            longest = max(longest, time.perf_counter() - t)
        total = time.perf_counter() - t0
        assert p.store.usage("").sandboxes == 0
        p.conn.close()
        return longest, total


def main(rounds: int, n: int) -> None:
    got: dict[str, list[tuple[float, float]]] = {"one": [], "stepped": []}
    for _ in range(rounds):
        got["one"].append(one_go(n))
        got["stepped"].append(stepped(n))
    med = {k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v))
           for k, v in got.items()}
    rows = [["in one go, one transaction (baseline)",
             common.fmt_ms(med["one"][0]), common.fmt_ms(med["one"][1]), "1.00×"],
            [f"a chunk of {CHUNK} rows per transaction, the loop free between (now)",
             common.fmt_ms(med["stepped"][0]), common.fmt_ms(med["stepped"][1]),
             common.ratio(med["stepped"][0], med["one"][0])]]
    common.publish("ledger_reconcile",
                   f"Ledger reconcile of {n:,} ended sandboxes: how long the loop is held",
                   common.table(["path", "longest hold of the loop ms", "total ms",
                                 "longest hold vs baseline"], rows),
                   [f"medians of {rounds} interleaved rounds; {n:,} rows of one project on "
                    "one node, none listed any more; a real SQLite store in a temporary "
                    "directory (WAL, synchronous=NORMAL, as the gateway opens it)"])


if __name__ == "__main__":
    args = common.parse_args(__doc__)
    main(3 if args.quick else 7, 2000 if args.quick else 32000)
