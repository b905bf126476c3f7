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
