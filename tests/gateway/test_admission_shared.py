"""One admission line for every gateway sharing a control store (``projects.db``).

Gateways here are separate :class:`Projects` on one SQLite file, each with its own
connection, as separate gateway processes have; in the HTTP test they are two gateway
apps on loopback in front of simulated node agents (real node API over HTTP, a backend
that keeps records and runs nothing: the order asserted is the gateways'). The crashed
gateway is a real process, killed with SIGKILL.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import dsec
from dsec.api.projects import Quota
from dsec.cluster.static import StaticCluster
from dsec.gateway.app import create_app
from dsec.gateway.projects import Projects
from dsec.gateway.projects.line import SharedLine
from dsec.gateway.projects.order import ArrivalOrder
from dsec.gateway.projects.quota import Ask
from tests.gateway.test_admission_metric import ROOT, scrape  # user -> gateway
from tests.support.gateway import serving
from tests.support.simnodes import simulated_nodes

CLUSTER = "dsec_test_shared_cluster"  # gateway -> node
ONE = Ask(1, 0.5, 64)


def _rows(p: Projects, path: str) -> int:
    return p.conn.execute("SELECT count(*) FROM line WHERE path = ?", (path,)).fetchone()[0]


async def _until(cond, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


class Blind(SharedLine):
    """Deliberately broken: a gateway that does not see the other gateways' tickets (the
    old behaviour, when the store held counts and no line)."""

    def earliest_in(self, path, before):
        got = super().earliest_in(path, before)
        return got if got is None or got[1] == self.gateway else None


@pytest.mark.parametrize("broken", [False, True], ids=["shared-line", "blind-gateway"])
async def test_a_waiter_on_one_gateway_is_not_passed_by_a_later_create_on_another(
        tmp_path, broken):
    """Quota 1, held. W waits on gateway A, then L on gateway B; the slot frees through
    B, whose own waiter hears of it first. W must be admitted first, and the order check
    of B counts a pass if one happens."""
    a, b = Projects(ROOT, tmp_path / "projects.db"), Projects(ROOT, tmp_path / "projects.db")
    seen: list[bool] = []
    b.admission.order = ArrivalOrder(lambda path, ok: seen.append(ok))
    if broken:
        b.admission.line = Blind(b.conn)
        # and A hears of room only by itself, as before the shared line (which is what
        # makes the pass certain here rather than a race with A's next look)
        a.admission.tick_s = a.admission.poll_s = 60.0
    a.store.create("s", Quota(sandboxes=1))
    held = await b.admission.admit("s", ONE, 0)
    order: list[str] = []

    async def wait(p: Projects, name: str):
        res = await p.admission.admit("s", ONE, 30)
        order.append(name)
        return p, res

    w = asyncio.create_task(wait(a, "W"))
    await _until(lambda: _rows(a, "s") == 1, "W's ticket in the store")
    late = asyncio.create_task(wait(b, "L"))
    await _until(lambda: _rows(a, "s") == 2, "L's ticket in the store")
    b.ledger.release(held.keys)
    b.admission.freed()
    done, _ = await asyncio.wait({w, late}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    p, res = done.pop().result()
    p.ledger.release(res.keys)
    a.admission.freed()
    b.admission.freed()
    await asyncio.wait_for(asyncio.gather(w, late), 30)
    if broken:
        assert order == ["L", "W"] and seen == [True, False]  # L passed W, and B says so
    else:
        assert order == ["W", "L"] and seen == [True, True]
    assert _rows(a, "s") == 0  # every ticket left with its create
    await a.stop()
    await b.stop()


async def test_the_fast_path_writes_no_ticket_and_every_ticket_leaves(tmp_path):
    """A create that fits with no one waiting leaves nothing in the line; a waiter that
    is admitted, one that gives up and one that is cancelled all take their rows with
    them."""
    p = Projects(ROOT, tmp_path / "projects.db")
    p.store.create("t", Quota(sandboxes=1))
    writes: list[str] = []
    p.conn.set_trace_callback(lambda sql: writes.append(sql) if "line" in sql and
                              sql.lstrip().upper().startswith(("INSERT", "DELETE")) else None)
    held = await p.admission.admit("t", ONE, 0)
    assert writes == [] and _rows(p, "t") == 0
    gives_up = asyncio.create_task(p.admission.admit("t", ONE, 0.3))
    cancelled = asyncio.create_task(p.admission.admit("t", ONE, 30))
    admitted = asyncio.create_task(p.admission.admit("t", ONE, 30))
    await _until(lambda: _rows(p, "t") == 3, "three tickets")
    with pytest.raises(dsec.QuotaExceeded):
        await gives_up
    cancelled.cancel()
    await _until(lambda: _rows(p, "t") == 1, "the two that left")
    p.ledger.release(held.keys)
    p.admission.freed()
    await asyncio.wait_for(admitted, 30)
    assert _rows(p, "t") == 0 and not p.admission.line.mine
    await p.stop()


_CRASHER = """
import asyncio, sys
from dsec.gateway.projects import Projects
from dsec.gateway.projects.quota import Ask

async def main():
    p = Projects("root", sys.argv[1])
    p.admission.line.beat_s = 0.2
    waiter = asyncio.create_task(p.admission.admit("c", Ask(1, 2.0, 64), 600))
    while not p.admission.line.mine:
        await asyncio.sleep(0.01)
    print(p.admission.line.gateway, flush=True)
    await waiter

asyncio.run(main())
"""


async def test_a_crashed_gateways_ticket_expires(tmp_path):
    """Gateway A (a process of its own) waits at the head of the line with a create that
    does not fit; gateway B's smaller create, which would fit, waits behind it, also
    past a lease while A beats. A is killed: once its lease has run out, B is admitted
    and A's rows are gone."""
    b = Projects(ROOT, tmp_path / "projects.db")
    b.admission.line.lease_s = 3.0
    b.store.create("c", Quota(cpu=1.0))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(Path(dsec.__file__).parents[1])] + sys.path))
    crasher = subprocess.Popen([sys.executable, "-c", _CRASHER, str(tmp_path / "projects.db")],
                               stdout=subprocess.PIPE, env=env, start_new_session=True)
    try:
        gateway_a = (await asyncio.to_thread(crasher.stdout.readline)).decode().strip()
        assert gateway_a.startswith("gw-"), "gateway A did not start waiting"
        with pytest.raises(dsec.QuotaExceeded, match="on another gateway"):
            await b.admission.admit("c", ONE, 0)
        await asyncio.sleep(4.0)  # past B's lease: A's beat keeps its ticket alive
        with pytest.raises(dsec.QuotaExceeded, match="on another gateway"):
            await b.admission.admit("c", ONE, 0)
    finally:
        os.killpg(crasher.pid, signal.SIGKILL)
        crasher.wait()
        crasher.stdout.close()
    res = await b.admission.admit("c", ONE, 60)
    assert len(res.keys) == 1
    assert b.conn.execute("SELECT count(*) FROM line WHERE gateway = ?",
                          (gateway_a,)).fetchone()[0] == 0
    assert b.conn.execute("SELECT count(*) FROM gateways WHERE id = ?",
                          (gateway_a,)).fetchone()[0] == 0
    await b.stop()


# ---- over HTTP: two gateway apps, one store, the same nodes ----

@pytest.fixture
async def nodes(tmp_path):
    async with simulated_nodes(tmp_path / "nodes", CLUSTER) as nodes:
        yield nodes


async def test_two_gateways_over_http_serve_one_line(tmp_path, nodes):
    """The same as the first test end to end: SDK -> gateway -> node API. W waits
    through gateway A, then L through gateway B; the held sandbox stops through B."""
    pa, pb = Projects(ROOT, tmp_path / "projects.db"), Projects(ROOT, tmp_path / "projects.db")
    apps = [create_app(StaticCluster(nodes.urls, CLUSTER), ROOT, projects=p)
            for p in (pa, pb)]
    async with serving(apps[0]) as url_a, serving(apps[1]) as url_b:
        async with dsec.AsyncClient(url_a, ROOT) as root:
            await root.projects.create("h", quota=dsec.Quota(sandboxes=1))
            token = await root.projects.create_token("h", role="user")
        before = await scrape(url_a, "h")  # one process: both apps count in one registry
        async with dsec.AsyncClient(url_a, token, timeout=60) as ca, \
                dsec.AsyncClient(url_b, token, timeout=60) as cb:
            held = await cb.create(cpu=0.05, memory_mb=64)
            w = asyncio.create_task(ca.create(wait_s=30, cpu=0.05, memory_mb=64))
            await _until(lambda: pa.admission.lines.get("h"), "W waiting on gateway A")
            late = asyncio.create_task(cb.create(wait_s=30, cpu=0.05, memory_mb=64))
            await _until(lambda: pb.admission.lines.get("h"), "L waiting on gateway B")
            await held.stop()  # through B: B's waiter hears of the room first
            done, _ = await asyncio.wait({w, late}, timeout=30,
                                         return_when=asyncio.FIRST_COMPLETED)
            assert done == {w}, "a later create on gateway B passed W"
            await w.result().stop()
            await (await asyncio.wait_for(late, 30)).stop()
        after = await scrape(url_a, "h")
    assert (after[0] - before[0], after[1] - before[1]) == (3, 0)  # none out of order
