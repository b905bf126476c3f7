"""The gateway's own count of admissions out of arrival order (Prometheus
``dsec_gateway_admissions_out_of_order_total``): 0 for first come, first served, and up as
soon as a grant passes an earlier waiter.

The pure check (:class:`ArrivalOrder`) and an admission whose line is deliberately
reversed run with no server; the burst is real HTTP on loopback: the SDK, a gateway with
its control store on SQLite, and simulated node agents (records only; the order measured
is the gateway's, not runc's) each serving its node API.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import dsec
from dsec.api.projects import Quota
from dsec.cluster.static import StaticCluster
from dsec.gateway.app import create_app
from dsec.gateway.projects import Projects
from dsec.gateway.projects.admission import Admission
from dsec.gateway.projects.line import SharedLine
from dsec.gateway.projects.order import ArrivalOrder
from dsec.gateway.projects.quota import Ask
from tests.support.gateway import serving
from tests.support.simnodes import simulated_nodes

CLUSTER = "dsec_test_order_cluster"  # gateway -> node
ROOT = "dsec_test_order_root"        # user -> gateway
ONE = Ask(1, 0.05, 64)


class _NoLine(SharedLine):
    def earliest_in(self, path, before):
        return None


class NewestFirst(Admission):
    """Deliberately broken admission: whoever joins the line goes to its head, so the
    latest arrival is served first (and it ignores the store's line, which would still
    hold each create behind the earlier ones)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.line = _NoLine(self.ledger.conn)

    def _join(self, spot):
        me = super()._join(spot)
        line = self.lines[spot.path]
        line.remove(me)
        line.insert(0, me)
        return me


def test_a_grant_is_out_of_order_only_while_an_earlier_ticket_waits():
    seen: list[tuple[str, bool]] = []
    order = ArrivalOrder(lambda path, ok: seen.append((path, ok)))
    for t in (1, 2, 3):
        order.waiting("a", t)
    order.waiting("b", 0)
    assert not order.granted("a", 2)  # 1 still waits
    assert order.granted("a", 1)
    order.gone("a", 3)               # gave up: nothing waits in "a" any more
    order.waiting("a", 3)            # came back (no node had room): waits at its ticket
    order.waiting("a", 4)
    assert order.granted("a", 3)
    assert order.granted("b", 0)     # projects are apart
    assert seen == [("a", False), ("a", True), ("a", True), ("b", True)]


async def _line_of_ten(admission: Admission, p: Projects, path: str) -> None:
    """Quota 1 held, ten creates wait, then room comes free one create at a time."""
    held = await admission.admit(path, ONE, 0)
    waiters = []
    for _ in range(10):
        waiters.append(asyncio.create_task(admission.admit(path, ONE, 30)))
        await asyncio.sleep(0)  # each takes its ticket before the next arrives
    keys, pending = held.keys, set(waiters)
    while pending:  # whoever the admission picks next
        p.ledger.release(keys)
        admission.freed()
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1
        keys = done.pop().result().keys
    p.ledger.release(keys)

@pytest.mark.parametrize("broken", [False, True], ids=["fifo", "newest-first"])
async def test_the_count_sees_a_line_that_lost_its_order(tmp_path, broken):
    p = Projects(ROOT, tmp_path / "projects.db")
    p.store.create("l", Quota(sandboxes=1))
    seen: list[bool] = []
    order = ArrivalOrder(lambda path, ok: seen.append(ok))
    kind = NewestFirst if broken else Admission
    await _line_of_ten(kind(p.ledger, p.store.quotas, order=order), p, "l")
    assert len(seen) == 11
    # newest first: the ten waiters are served newest first, and all but the last one
    # or two pass someone still waiting (8 when the admissions' group commit lets the
    # oldest take the room freed while the newest's try is in flight)
    assert seen.count(False) >= 8 if broken else seen.count(False) == 0


# ---- a burst over HTTP ----

def _gateway(urls: list[str], projects: Projects):
    return serving(create_app(StaticCluster(urls, CLUSTER), ROOT, projects=projects))


async def scrape(url: str, project: str) -> tuple[float, float]:
    """(admissions, of which out of order) of ``project`` from the gateway's /metrics."""
    async with httpx.AsyncClient(base_url=url, timeout=10,
                                 headers={"authorization": f"Bearer {ROOT}"}) as http:
        r = await http.get("/metrics")
    r.raise_for_status()
    got = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            if s.labels.get("project") == project and s.name.endswith("_total"):
                got[s.name] = s.value
    return (got.get("dsec_gateway_admissions_total", 0.0),
            got.get("dsec_gateway_admissions_out_of_order_total", 0.0))


@pytest.fixture
async def nodes(tmp_path):
    async with simulated_nodes(tmp_path / "nodes", CLUSTER) as nodes:
        yield nodes


@pytest.mark.parametrize("broken", [False, True], ids=["fifo", "newest-first"])
async def test_a_queued_burst_over_http_is_admitted_in_arrival_order(tmp_path, nodes, broken):
    total, quota = 120, 12
    project = f"burst-{'broken' if broken else 'fifo'}"
    projects = Projects(ROOT, tmp_path / "projects.db")
    if broken:
        projects.admission = NewestFirst(projects.ledger, projects.store.quotas)
    async with _gateway(nodes.urls, projects) as url:
        async with dsec.AsyncClient(url, ROOT) as root:
            await root.projects.create(project, quota=dsec.Quota(sandboxes=quota))
            token = await root.projects.create_token(project, role="user")
        before = await scrape(url, project)
        async with dsec.AsyncClient(url, token, timeout=120) as c:

            async def one() -> None:
                sb = await c.create(wait_s=60, cpu=0.05, memory_mb=64)
                # held long enough that a line forms however slowly a loaded machine
                # sends the burst (120 x 0.2 s over 12 slots: at least 2 s)
                await asyncio.sleep(0.2)
                await sb.stop()

            tasks = []
            for _ in range(total):
                tasks.append(asyncio.create_task(one()))
                await asyncio.sleep(0.001)  # sent in a known order
            await asyncio.gather(*tasks)
        admitted, out = await scrape(url, project)
    assert admitted - before[0] == total
    if broken:
        assert out > 0  # the count sees it
    else:
        assert out == 0
