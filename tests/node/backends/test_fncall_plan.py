"""The fncall request model and planning: pure, no machine needed."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from dsec.api.fncall import FnCallRequest, FnCallResult, RemoteError, RemoteErrorInfo
from dsec.node.backends.fncall.plan import plan_call


def test_python_runs_in_the_warm_interpreter():
    plan = plan_call(FnCallRequest(code="print(1)", argv=["a"]))
    assert [(s.kind, s.argv, s.source) for s in plan.steps] == [("python", ["main.py", "a"],
                                                                 "print(1)")]


def test_c_compiles_then_runs_with_extra_flags():
    plan = plan_call(FnCallRequest(language="c", code="int main(){}", compile_args=["-DX"],
                                   argv=["1"]))
    assert [s.stage for s in plan.steps] == ["compile", "run"]
    assert plan.steps[0].argv[0] == "gcc" and plan.steps[0].argv[-1] == "-DX"
    assert plan.steps[1].argv == ["./main", "1"]
    assert plan.files["main.c"] == b"int main(){}"


def test_shell_code_becomes_a_file_beside_the_inputs():
    plan = plan_call(FnCallRequest(language="bash", code="echo hi", files={"d/x": b"1"}))
    assert plan.steps[0].argv == ["bash", "main.sh"]
    assert plan.files == {"d/x": b"1", "main.sh": b"echo hi"}


@pytest.mark.parametrize("path", ["/etc/passwd", "../x", "a/../../x", ""])
def test_file_paths_must_stay_in_the_call_directory(path):
    with pytest.raises(ValidationError, match="relative"):
        FnCallRequest(code="1", files={path: b""})
    with pytest.raises(ValidationError, match="relative"):
        FnCallRequest(code="1", return_files=[path])


def test_exactly_one_of_code_or_callable_and_callables_are_python():
    with pytest.raises(ValidationError, match="exactly one"):
        FnCallRequest()
    with pytest.raises(ValidationError, match="exactly one"):
        FnCallRequest(code="1", callable=b"x")
    with pytest.raises(ValidationError, match="runs in python"):
        FnCallRequest(language="bash", callable=b"x")


def test_bytes_are_base64_on_the_wire_and_bytes_in_python():
    req = FnCallRequest(code="1", stdin=b"\x00\xff", files={"a": b"hi"})
    wire = req.model_dump(mode="json")
    assert wire["stdin"] == "AP8=" and wire["files"] == {"a": "aGk="}
    assert FnCallRequest.model_validate(wire) == req


def test_result_unpickles_a_value_and_raises_a_remote_error():
    import cloudpickle
    ok = FnCallResult(exit_code=0, value=cloudpickle.dumps({"x": 1}))
    assert ok.result() == {"x": 1}
    bad = FnCallResult(exit_code=0, error=RemoteErrorInfo(type="KeyError", message="'k'",
                                                          traceback="Traceback ... in f"))
    with pytest.raises(RemoteError) as info:
        bad.result()
    assert info.value.remote_type == "KeyError" and "in f" in info.value.remote_traceback
    with pytest.raises(TimeoutError):
        FnCallResult(exit_code=-1, timed_out=True).result()


@pytest.mark.parametrize("report", [b"[" * 5000, b"{", b"[1]"], ids=["nested", "cut", "list"])
def test_a_callables_error_report_that_is_not_an_object_is_a_worker_error(report):
    """The call's code shares fd 3 with the report: garbage there must not end the server."""
    import base64

    from dsec.node.backends.fncall.server import Worker
    res = {"result": base64.b64encode(b"E" + report).decode(), "exit_code": 0, "signal": None,
           "stderr": ""}
    value, error = Worker._decode_callable(res)
    assert value is None and error["type"] == "WorkerError" and "fd 3" in error["message"]
