"""The node's half of protected paths: which commands carry them to the agent."""

import json

from dsec.api.models import ExecRequest, SandboxSpec
from dsec.node.agent.client import SpawnRequest
from dsec.node.backends.base import SandboxRecord
from dsec.node.execution import build_spawn


class _NoFiles:
    def files(self, rec):  # resolve_user reads /etc/passwd only for user names
        raise AssertionError("not needed for root")


def _rec(paths):
    return SandboxRecord(id="sb-x", spec=SandboxSpec(protected_paths=paths), state="running",
                         created_at=0, last_active_at=0)


def test_every_exec_carries_the_protected_paths():
    spawn = build_spawn(_NoFiles(), _rec(["/grader"]), ExecRequest(cmd="true"))
    assert json.loads(spawn.encode())["protect"] == ["/grader"]


def test_the_grading_step_carries_none():
    spawn = build_spawn(_NoFiles(), _rec(["/grader"]), ExecRequest(cmd="true", grading=True))
    assert "protect" not in json.loads(spawn.encode())


def test_a_sandbox_without_protected_paths_sends_no_key():
    # an agent older than the key would refuse the spawn; none is sent when unused
    assert "protect" not in json.loads(SpawnRequest(argv=["true"], env={}).encode())
