"""Prometheus metrics of the gateway itself (the node's own are in :mod:`dsec.node.metrics`
when the node runs in this process)."""

from __future__ import annotations

import re

from prometheus_client import Counter, Gauge, Histogram

from dsec.api.projects import within

__all__ = ["REQUESTS", "PLACEMENT_SECONDS", "RETRIES", "NODES", "NODE_SANDBOXES",
           "ADMISSIONS", "ADMISSIONS_OUT_OF_ORDER", "admitted", "RequestMetrics", "scoped"]

REQUESTS = Counter("dsec_gateway_requests_total", "Requests answered, by route and status",
                   ["method", "route", "status"])
PLACEMENT_SECONDS = Histogram("dsec_gateway_placement_seconds", "Time to choose a node",
                              buckets=(1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1))
RETRIES = Counter("dsec_gateway_retries_total",
                  "Requests sent again: to another node after a refusal, or on a stale "
                  "connection", ["reason"])
NODES = Gauge("dsec_gateway_nodes", "Nodes this gateway knows, by health", ["health"])
NODE_SANDBOXES = Gauge("dsec_gateway_node_sandboxes",
                       "Sandboxes on each node as the watcher last saw them", ["node"])
ADMISSIONS = Counter("dsec_gateway_admissions_total",
                     "Creates (and runs of a batch) given room by queued admission, by "
                     "project ('/' is the root)", ["project"])
ADMISSIONS_OUT_OF_ORDER = Counter(
    "dsec_gateway_admissions_out_of_order_total",
    "Of those, given room while an earlier create of the same project still waited, on "
    "this gateway or on another sharing its control store: 0 when admission is first "
    "come, first served", ["project"])

_admitted: dict[str, tuple] = {}  # per project, both children: labels() takes a lock


def admitted(project: str, in_order: bool) -> None:
    """Count one grant of queued admission. Both series of a project appear with its first
    grant, so a scrape shows an explicit 0 out of order."""
    if (pair := _admitted.get(project)) is None:
        label = project or "/"
        pair = _admitted[project] = (ADMISSIONS.labels(label),
                                     ADMISSIONS_OUT_OF_ORDER.labels(label))
    pair[0].inc()
    if not in_order:
        pair[1].inc()


class RequestMetrics:
    """Counts each answered HTTP request by route template and status. Not a middleware of
    its own: :class:`~dsec.gateway.logs.RequestIds` already sees every request's status,
    and calls :meth:`count` as it ends (one ASGI layer and one ``send`` wrapper fewer
    per request)."""

    def __init__(self) -> None:
        self._counters: dict[tuple[str, str, int], object] = {}  # labels() takes a lock

    def count(self, scope, status: int) -> None:
        """One request of ``scope`` answered ``status`` (500 when it sent no answer)."""
        route = getattr(scope.get("route"), "path", None) or "unmatched"
        key = (scope["method"], route, status or 500)
        if (counter := self._counters.get(key)) is None:
            counter = self._counters[key] = REQUESTS.labels(key[0], route, str(key[2]))
        counter.inc()


# project paths hold no '"' or '\\', so a label value is everything up to the next quote
_PROJECT = re.compile(r'[{,]project="([^"]*)"')


def scoped(text: str, scope: str | None) -> str:
    """Prometheus ``text`` as a token of project ``scope`` may read it: the samples labelled
    with another project (outside ``scope`` and below; the root is ``/``) left out, so a
    scrape names no project the token cannot see. ``None`` (the root token): all of it."""
    if scope is None:
        return text
    keep = []
    for line in text.splitlines(keepends=True):
        m = _PROJECT.search(line) if not line.startswith("#") else None
        if m is None or (m.group(1) != "/" and within(m.group(1), scope)):
            keep.append(line)
    return "".join(keep)
