"""Lease decisions and the merge of per-node job shares: pure."""

from dsec.api.rl import JobInfo, merge_job_infos
from dsec.node.jobs import Lease, lease_action


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
