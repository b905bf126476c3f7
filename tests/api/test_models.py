import pytest
from pydantic import ValidationError

from dsec.api.models import ExecRequest, SandboxSpec


def test_memory_out_of_range_says_what_to_change():
    with pytest.raises(ValidationError, match="memory_mb must be between 16 and 65536; got 4"):
        SandboxSpec(memory_mb=4)


def test_cpu_out_of_range():
    with pytest.raises(ValidationError, match="cpu must be between"):
        SandboxSpec(cpu=1000)


def test_unknown_field_is_an_error():
    with pytest.raises(ValidationError, match="memroy_mb"):
        SandboxSpec(memroy_mb=5)


def test_empty_command_rejected():
    with pytest.raises(ValidationError):
        ExecRequest(cmd=[])
    with pytest.raises(ValidationError):
        ExecRequest(cmd="")


def test_protected_paths_are_normalised():
    spec = SandboxSpec(protected_paths=["/grader/", "//repo//tests/hidden.sh"])
    assert spec.protected_paths == ["/grader", "/repo/tests/hidden.sh"]


@pytest.mark.parametrize("path,needle", [("grader", "absolute"), ("/", "'/'"),
                                         ("/a/./b", "'..'"), ("/.dsec/x", "/.dsec")])
def test_bad_protected_paths_say_what_to_change(path, needle):
    with pytest.raises(ValidationError) as err:
        SandboxSpec(protected_paths=[path])
    assert needle in str(err.value)


def test_at_most_64_protected_paths():
    with pytest.raises(ValidationError):
        SandboxSpec(protected_paths=[f"/p{i}" for i in range(65)])


def test_grading_is_off_by_default():
    assert ExecRequest(cmd="true").grading is False


@pytest.mark.parametrize("model,field", [
    ("dsec.api.models:SandboxSpec", "ttl_s"),
    ("dsec.api.models:SandboxSpec", "idle_ttl_s"),
    ("dsec.api.models:SandboxSpec", "idle_reclaim_s"),
    ("dsec.api.process:ProcessRequest", "timeout"),
    ("dsec.api.process:TimeoutRequest", "timeout_s"),
    ("dsec.api.rl:HeartbeatRequest", "stop_after_s"),
])
def test_seconds_past_30_days_are_refused_naming_the_maximum(model, field):
    """ttl_s=1e300 once made a sandbox expiring at 1e300; every such field has one bound."""
    import importlib

    from dsec.api.errors import InvalidArgument
    from dsec.api.models import validated
    MAX_LIFE_S = 30 * 86400.0  # limits.MAX_LIFE_S, as the README states it
    mod, _, name = model.partition(":")
    cls = getattr(importlib.import_module(mod), name)
    extra = {"cmd": "true"} if name == "ProcessRequest" else {}
    assert getattr(validated(cls, **{field: MAX_LIFE_S}, **extra), field) == MAX_LIFE_S
    for bad in (MAX_LIFE_S + 1, 1e300):
        with pytest.raises(InvalidArgument, match=f"{field}: .*{MAX_LIFE_S:.0f}"):
            validated(cls, **{field: bad}, **extra)
