"""The node's brief memory of sandboxes it stopped on its own (pure, no machine)."""

from dsec.api.errors import SandboxStopped
from dsec.api.scope import caller_scope
from dsec.node.ended import EndedSandboxes


def test_an_expired_sandbox_says_so_then_is_forgotten():
    ended = EndedSandboxes(keep_s=100, keep_count=10)
    ended.remember("sb-a", "expired (its timeout ran out)", at=1000)
    err = ended.error("sb-a", now=1030)
    assert isinstance(err, SandboxStopped)
    assert "sb-a expired (its timeout ran out) 30s ago" in err.message
    assert "set_timeout" in err.message
    assert ended.error("sb-b", now=1030) is None
    assert ended.error("sb-a", now=1101) is None  # past keep_s


def test_the_memory_is_bounded_oldest_first():
    ended = EndedSandboxes(keep_s=1e9, keep_count=3)
    for i in range(5):
        ended.remember(f"sb-{i}", "expired")
    assert [f"sb-{i}" in ended for i in range(5)] == [False, False, True, True, True]


def test_only_a_caller_that_sees_its_project_hears_it_ended():
    ended = EndedSandboxes(keep_s=100, keep_count=10)
    ended.remember("sb-a", "expired", at=1000, project="team/a")
    seen = {}
    for scope in (None, "team", "team/a", "team/b", "team/a/x"):
        mark = caller_scope.set(scope)
        try:
            seen[scope] = ended.error("sb-a", now=1001) is not None
        finally:
            caller_scope.reset(mark)
    assert seen == {None: True, "team": True, "team/a": True, "team/b": False,
                    "team/a/x": False}
