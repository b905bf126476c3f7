"""Prometheus metrics of the node; the gateway exposes them at /metrics."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

__all__ = ["CREATIONS", "CREATE_FAILURES", "CREATE_SECONDS", "EXEC_SECONDS", "SANDBOXES"]

CREATIONS = Counter("dsec_sandbox_creations_total", "Sandboxes created", ["backend"])
CREATE_FAILURES = Counter("dsec_sandbox_create_failures_total", "Sandbox creations that failed",
                          ["backend"])
CREATE_SECONDS = Histogram("dsec_sandbox_create_seconds", "Time to create a sandbox",
                           ["backend"], buckets=(.01, .02, .05, .1, .2, .5, 1, 2, 5, 10, 30))
EXEC_SECONDS = Histogram("dsec_exec_seconds", "Exec latency inside the node", ["backend"],
                         buckets=(.001, .002, .005, .01, .02, .05, .1, .5, 1, 5, 30, 120))
SANDBOXES = Gauge("dsec_sandboxes", "Sandboxes on this node by state", ["state"])
