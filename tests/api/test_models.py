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
