"""Lease decisions, leases kept per project, and the merge of per-node job shares: pure."""

import json

from dsec.api.rl import JobInfo, merge_job_infos
from dsec.api.scope import caller_scope
from dsec.node.jobs import JobLeases, Lease, lease_action


def test_a_fresh_lease_keeps_the_job():
    assert lease_action(Lease("j", expires_at=100, stop_after_s=50), now=99) == "keep"


def test_a_lapsed_lease_pauses_once():
    lease = Lease("j", expires_at=100, stop_after_s=50)
    assert lease_action(lease, now=100) == "pause"
    lease.lapsed = True
    assert lease_action(lease, now=120) == "keep"


def test_a_long_lapsed_lease_stops_the_job():
    assert lease_action(Lease("j", 100, 50, lapsed=True), now=150) == "stop"
    assert lease_action(Lease("j", 100, None, lapsed=True), now=10**9) == "keep"


def test_job_shares_of_several_nodes_add_up():
    a = {"j": JobInfo(job="j", sandboxes=2, states={"running": 2}, cpu=2, memory_mb=512)}
    b = {"j": JobInfo(job="j", sandboxes=1, states={"paused": 1}, cpu=1, memory_mb=256),
         "k": JobInfo(job="k", sandboxes=1, states={"running": 1})}
    j, k = merge_job_infos([a, b])
    assert (j.sandboxes, j.states, j.cpu, j.memory_mb) == (3, {"running": 2, "paused": 1}, 3, 768)
    assert k.job == "k"


class _Meta:
    """The node store's meta table, in memory."""

    def __init__(self, raw: str | None = None) -> None:
        self.values = {} if raw is None else {JobLeases.KEY: raw}

    def meta(self, key):
        return self.values.get(key)

    def set_meta(self, key, value):
        self.values[key] = value


def test_leases_of_one_job_name_are_per_project():
    store = _Meta()
    leases = JobLeases(store)
    for project, until in (("team/a", 100), ("team/b", 200)):
        mark = caller_scope.set(project)
        try:
            leases.renew("run-17", 0, until, None)
        finally:
            caller_scope.reset(mark)
    mark = caller_scope.set("team/b")
    try:
        leases.drop("run-17")  # B's own only
    finally:
        caller_scope.reset(mark)
    kept = JobLeases(store).leases  # as saved
    assert [(x.project, x.expires_at) for x in kept.values()] == [("team/a", 100)]


def test_a_lease_saved_before_leases_had_projects_is_the_roots():
    old = json.dumps({"run-17": {"job": "run-17", "expires_at": 5.0, "stop_after_s": None,
                                 "lapsed": False}})
    (lease,) = JobLeases(_Meta(old)).leases.values()
    assert (lease.job, lease.project) == ("run-17", None)
