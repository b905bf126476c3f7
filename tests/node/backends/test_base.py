"""The Backend contract: a verb a backend does not offer raises Unsupported from the base."""

from __future__ import annotations

import asyncio

import pytest

from dsec.api.errors import Unsupported
from dsec.api.models import ExecRequest, SandboxSpec
from dsec.node.backends.base import Backend, ReclaimPlan, SandboxRecord
from dsec.node.backends.container import ContainerBackend
from dsec.node.backends.fncall import FncallBackend
from dsec.node.backends.microvm import MicroVMBackend, VMBackend


class Minimal(Backend):
    """Only the lifecycle every backend must have."""

    name = "minimal"

    async def start(self, rec): return {}
    async def stop(self, rec): return None
    async def alive(self, rec): return True


REC = SandboxRecord(id="sb-x-1", spec=SandboxSpec(), state="running", created_at=0,
                    last_active_at=0)

SYNC = [lambda b: b.connector(REC), lambda b: b.files(REC), lambda b: b.upper_dir(REC),
        lambda b: b.memory_bytes(REC), lambda b: b.oom_kills(REC), lambda b: b.console(REC),
        lambda b: b.reclaim(REC, ReclaimPlan(0, 1)), lambda b: b.restore(REC)]
ASYNC = [lambda b: b.pause(REC), lambda b: b.resume(REC), lambda b: b.apply_spec(REC),
         lambda b: b.pack_diff(REC, "t:1", []), lambda b: b.screenshot(REC),
         lambda b: b.type_text(REC, "x"), lambda b: b.press_keys(REC, ["a"]),
         lambda b: b.click(REC, 1, 1)]


@pytest.mark.parametrize("verb", SYNC)
def test_sync_verb_not_offered_raises_unsupported(verb):
    with pytest.raises(Unsupported, match="container sandboxes|backend='vm'"):
        verb(Minimal())


@pytest.mark.parametrize("verb", ASYNC)
def test_async_verb_not_offered_raises_unsupported(verb):
    with pytest.raises(Unsupported):
        asyncio.run(verb(Minimal()))


def test_default_exec_needs_what_an_agent_backend_offers():
    # the default exec is the agent path: a backend without one gets Unsupported, not
    # an AttributeError
    with pytest.raises(Unsupported, match="minimal|container"):
        asyncio.run(Minimal().exec(REC, ExecRequest(cmd="true")))


def test_close_is_optional():
    asyncio.run(Minimal().close())


@pytest.mark.parametrize("cls", [ContainerBackend, FncallBackend, MicroVMBackend, VMBackend])
def test_every_backend_keeps_the_contract(cls):
    assert issubclass(cls, Backend) and cls.name
