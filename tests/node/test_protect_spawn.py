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


def test_the_grading_step_carries_them_only_as_nolink():
    spawn = build_spawn(_NoFiles(), _rec(["/grader"]), ExecRequest(cmd="true", grading=True))
    body = json.loads(spawn.encode())
    assert "protect" not in body and body["nolink"] == ["/grader"]


def test_a_sandbox_without_protected_paths_sends_no_key():
    # an agent older than the key would refuse the spawn; none is sent when unused
    body = json.loads(SpawnRequest(argv=["true"], env={}).encode())
    assert "protect" not in body and "nolink" not in body


def test_a_guest_kernel_runs_landlock_only_when_built_in_and_listed():
    from dsec.node.protection import config_has_landlock
    cfg = 'CONFIG_SECURITY_LANDLOCK=y\nCONFIG_LSM="landlock,lockdown,yama,apparmor"\n'
    assert config_has_landlock(cfg)
    assert not config_has_landlock(cfg, "console=ttyS0 lsm=yama,apparmor")
    assert not config_has_landlock('# CONFIG_SECURITY_LANDLOCK is not set\nCONFIG_LSM="landlock"\n')
    assert not config_has_landlock('CONFIG_SECURITY_LANDLOCK=y\nCONFIG_LSM="yama"\n')


def test_a_backend_that_cannot_protect_says_so():
    import pytest

    from dsec.api.errors import Unsupported
    from dsec.node.protection import check_protection
    with pytest.raises(Unsupported, match="container"):
        check_protection(object(), "fncall")
