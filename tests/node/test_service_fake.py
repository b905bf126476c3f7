"""NodeService's own logic over the fake backend: fast, no runc (the fake is the only fake)."""

import asyncio
import time
from pathlib import Path

import pytest

import dsec
from dsec.api.models import ExecRequest, SandboxSpec
from dsec.node.agent.build import ensure_agent
from dsec.node.backends.base import SandboxRecord
from dsec.node.backends.fake import FakeBackend
from dsec.node.config import NodeConfig
from dsec.node.service import NodeService
from dsec.node.store import NodeStore
from tests.support.fakenode import fake_node


@pytest.fixture
async def node(tmp_path: Path):
    svc = fake_node(tmp_path, "node-fa4e0001")
    yield svc
    await svc.close(stop_sandboxes=True)


async def test_create_exec_stop(node):
    info = await node.create(SandboxSpec())
    assert info.id.startswith("sb-fa4e0001-") and info.state == "running"
    r = await node.exec(info.id, ExecRequest(cmd="echo $((1+2))"))
    assert r.stdout == "3\n"
    await node.stop(info.id)
    with pytest.raises(dsec.NotFound):
        await node.get(info.id)


async def test_reaper_stops_expired_and_idle(node):
    old = await node.create(SandboxSpec(ttl_s=10))
    idle = await node.create(SandboxSpec(idle_ttl_s=5))
    keep = await node.create(SandboxSpec(ttl_s=100, idle_ttl_s=50))
    await node.reap(time.time() + 20)
    left = {i.id for i in await node.list()}
    assert left == {keep.id} and old.id not in left and idle.id not in left


async def test_a_request_while_the_reaper_stops_it_hears_expired(node):
    sb = await node.create(SandboxSpec(ttl_s=10))
    backend = node.backends["container"]
    stopping, release = asyncio.Event(), asyncio.Event()
    real_stop = backend.stop

    async def slow_stop(rec):  # the container takes its time to go
        stopping.set()
        await release.wait()
        await real_stop(rec)

    backend.stop = slow_stop
    reaping = asyncio.create_task(node.reap(time.time() + 20))
    await stopping.wait()
    try:
        with pytest.raises(dsec.SandboxStopped, match="expired"):
            await node.exec(sb.id, ExecRequest(cmd="true"))
    finally:
        release.set()
        await reaping
    with pytest.raises(dsec.SandboxStopped, match="expired"):
        await node.exec(sb.id, ExecRequest(cmd="true"))


async def test_idle_pause_instead_of_stop(node):
    sb = await node.create(SandboxSpec(idle_ttl_s=5, on_idle="pause"))
    await node.reap(time.time() + 10)
    assert (await node.get(sb.id)).state == "paused"
    await node.exec(sb.id, ExecRequest(cmd="true"))  # any request resumes
    assert (await node.get(sb.id)).state == "running"


async def test_admission_refuses_past_the_limit(tmp_path):
    from dsec.placement.admission import AdmissionPolicy
    config = NodeConfig(state_dir=tmp_path, admission=AdmissionPolicy(max_sandboxes=2))
    svc = NodeService(config, {"container": FakeBackend(tmp_path, ensure_agent(tmp_path / "b"))},
                      NodeStore(tmp_path / "node.db"), "node-fa4e0002")
    try:
        await svc.create(SandboxSpec())
        await svc.create(SandboxSpec())
        with pytest.raises(dsec.Capacity, match="limit 2"):
            await svc.create(SandboxSpec())
    finally:
        await svc.close(stop_sandboxes=True)


async def test_records_are_durable(node, tmp_path):
    sb = await node.create(SandboxSpec(labels={"k": "v"}))
    rows = {r.id: r for r in NodeStore(tmp_path / "node.db").all()}
    assert rows[sb.id].spec.labels == {"k": "v"} and rows[sb.id].state == "running"


def test_a_saved_spec_past_todays_rules_still_loads(tmp_path):
    """A sandbox made when a bound was looser (here a ttl_s over today's 30 days) is loaded
    as it was saved: a node restarting must not lose it, nor fail to start."""
    store = NodeStore(tmp_path / "node.db")
    spec = SandboxSpec.model_construct(**{**SandboxSpec().model_dump(), "ttl_s": 1e12})
    store.put(SandboxRecord(id="sb-fa4e0003-1", spec=spec, state="running", created_at=1.0,
                            last_active_at=1.0, expires_at=None, runtime={}, error=None))
    store.close()
    again = NodeStore(tmp_path / "node.db")
    try:
        [rec] = again.all()
        assert rec.id == "sb-fa4e0003-1" and rec.spec.ttl_s == 1e12
    finally:
        again.close()


async def test_another_projects_snapshot_is_not_found_where_no_image_is_resolved(node, tmp_path):
    """A warm fncall worker or a pooled sandbox of an image is used by name, without the
    image being resolved (which is where a project's snapshot is hidden from others)."""
    from dsec.api.fncall import FnCallRequest, FnCallResult
    from dsec.api.scope import caller_scope
    from dsec.images import ImageService
    from dsec.node.pool import WarmPool

    images = ImageService(tmp_path / "images")
    images.ensure_busybox()
    images.commit("ws/a:v1", images.manifest("busybox").layers, project="team/a")
    node.backends["container"].images = images
    ran: list[str] = []

    class WarmWorkers:  # runs a call in the image it names, as a warm worker would
        images = None

        async def call(self, req):
            ran.append(req.image)
            return FnCallResult(exit_code=0)

        async def close(self):
            pass

    node.backends["fncall"] = WarmWorkers()
    pooled = SandboxRecord(id="sb-fa4e0001-000000000001", spec=SandboxSpec(image="ws/a:v1"),
                           state="pooled", created_at=0, last_active_at=0)
    node.pool = WarmPool({"ws/a:v1": 1})
    node.pool.add(pooled)
    call = FnCallRequest(code="print(1)", image="ws/a:v1")
    mark = caller_scope.set("team/b")
    try:
        with pytest.raises(dsec.NotFound, match="image 'ws/a:v1' not found"):
            await node.fncall(call)
        with pytest.raises(dsec.NotFound, match="image 'ws/a:v1' not found"):
            await node.create(SandboxSpec(image="ws/a:v1"))
    finally:
        caller_scope.reset(mark)
    assert ran == [] and node.pool.members["ws/a:v1"] == [pooled]  # still there, untouched
    mark = caller_scope.set("team/a")
    try:
        await node.fncall(call)
    finally:
        caller_scope.reset(mark)
    assert ran == ["ws/a:v1"]
    node.pool.members.clear()
    images.unmount_all()
