"""The SandboxFusion request/result mapping, without a server."""

from __future__ import annotations

import pytest

from dsec.api.fncall import FnCallResult
from dsec.integrations.sandboxfusion.languages import RECIPES, parse_probe, probe_script, source_for
from dsec.integrations.sandboxfusion.models import LANGUAGES, RunCodeRequest
from dsec.integrations.sandboxfusion.plan import (DRIVER_DIR, BadRequest, answer, memory_for,
                                                  plan)


def driver_result(c_rc=None, r_rc=None, stdout="", sizes="", **kw) -> FnCallResult:
    files = {f"{DRIVER_DIR}/sizes": sizes.encode()}
    if c_rc is not None:
        files[f"{DRIVER_DIR}/c.rc"] = c_rc.encode()
        files[f"{DRIVER_DIR}/c.err"] = b"warn"
    if r_rc is not None:
        files[f"{DRIVER_DIR}/r.rc"] = r_rc.encode()
    return FnCallResult(exit_code=0, stdout=stdout, files=files, **kw)


def test_python_runs_natively_and_others_through_the_driver():
    py = plan(RunCodeRequest(code="print(1)", language="python"), "img")
    assert (py.native, py.request.language, py.request.code) == (True, "python", "print(1)")
    cpp = plan(RunCodeRequest(code="int main(){}", language="cpp"), "img")
    assert (cpp.native, cpp.request.language) == (False, "bash")
    assert cpp.request.files["main.cpp"] == b"int main(){}"
    assert "timeout -k 1 10.000 bash -c 'g++" in cpp.request.code


def test_fetch_files_take_the_driver_so_sizes_are_checked():
    c = plan(RunCodeRequest(code="x", language="python", fetch_files=["a"]), "img")
    assert not c.native and c.request.argv == ["a"] and "a" in c.request.return_files


def test_compile_and_run_results_are_separate():
    c = plan(RunCodeRequest(code="int main(){}", language="cpp"), "img")
    r = answer(c, driver_result("0 1500000000", "0 2000000", stdout="hi\n"))
    assert r.status == "Success"
    assert (r.compile_result.execution_time, r.compile_result.stderr) == (1.5, "warn")
    assert (r.run_result.return_code, r.run_result.stdout) == (0, "hi\n")


def test_timeout_status_needs_the_limit_reached():
    c = plan(RunCodeRequest(code="int main(){}", language="cpp", run_timeout=2), "img")
    assert answer(c, driver_result("0 1", "124 2000000000")).run_result.status == \
        "TimeLimitExceeded"
    r = answer(c, driver_result("0 1", "124 1000000"))  # the program's own exit 124
    assert (r.run_result.status, r.run_result.return_code, r.status) == \
        ("Finished", 124, "Failed")


def test_failed_compile_skips_run():
    c = plan(RunCodeRequest(code="x", language="cpp"), "img")
    r = answer(c, driver_result("1 5"))
    assert r.status == "Failed" and r.run_result is None


def test_a_step_with_no_status_is_a_sandbox_error():
    c = plan(RunCodeRequest(code="x", language="cpp"), "img")
    assert answer(c, driver_result("0 1")).status == "SandboxError"


def test_oversized_fetched_file_is_an_error_not_a_cut():
    c = plan(RunCodeRequest(code="x", language="perl", fetch_files=["big"]), "img")
    r = answer(c, driver_result(None, "0 1", sizes=f"{(16 << 20) + 1} big\n"))
    assert r.status == "SandboxError" and "file 'big' holds 16777217 bytes" in r.message


def test_truncated_output_is_an_error():
    c = plan(RunCodeRequest(code="x", language="python"), "img")
    r = answer(c, FnCallResult(exit_code=0, stdout="x", stdout_truncated=True))
    assert r.status == "SandboxError" and "stdout" in r.message


def test_memory_rounds_up_to_a_pool_size():
    assert [memory_for(m) for m in (-1, 1, 129, 1024, 3000)] == [1024, 128, 256, 1024, 4096]
    with pytest.raises(BadRequest):
        memory_for(1 << 20)


def test_bad_base64_is_a_bad_request():
    with pytest.raises(BadRequest, match="base64"):
        plan(RunCodeRequest(code="x", language="python", files={"a": "!!"}), "img")


def test_every_recipe_language_is_sandboxfusions():
    assert set(RECIPES) <= set(LANGUAGES)
    assert parse_probe("python\nbogus\ncpp\n") == {"python", "cpp"}
    assert "command -v g++" in probe_script()


def test_php_tag_and_junit_class_name():
    assert source_for("php", "echo 1;")[1].startswith("<?php\n")
    assert source_for("php", "<?php echo 1;")[1] == "<?php echo 1;"
    assert source_for("junit", "public class FooTest {}")[0] == "FooTest.java"
    assert source_for("scala", "println(1)")[2] == "Object name not found."


async def test_json_nested_past_the_stack_answers_422_not_500():
    from dsec.integrations.sandboxfusion.routes import _parse

    class Deep:
        async def body(self):
            return b'{"code":' + b"[" * 5000 + b"]" * 5000 + b"}"

    resp = await _parse(Deep())
    assert resp.status_code == 422
    assert b"nested too deeply" in resp.body


class _Seen:
    """A stand-in for the in-process gateway (the cache, not the gateway, is under test
    here; tests/integrations/test_sandboxfusion.py runs the real one): each caller sees
    its own images, and a probe answers which languages an image has."""

    def __init__(self, images_of: dict[str, set[str]]) -> None:
        self.images_of, self.probes = images_of, []

    async def images(self, auth: str) -> set[str]:
        return self.images_of[auth]

    async def fncall(self, req, auth: str) -> FnCallResult:
        if req.image not in self.images_of[auth]:
            raise AssertionError(f"{auth} probed {req.image}, which it does not see")
        self.probes.append((auth, req.image))
        return FnCallResult(exit_code=0, stdout="python\n", stderr="")


async def test_which_images_run_a_language_is_known_per_caller():
    """A project's own snapshot named like a configured image is seen, and probed, by that
    project only: another caller's answer comes from what it sees."""
    from dsec.integrations.sandboxfusion.gateway import Availability
    seen = _Seen({"Bearer a": {"sandboxfusion:1"}, "Bearer b": set()})
    avail = Availability(seen, ["sandboxfusion:1"])
    assert await avail.image_for("python", "Bearer a") == "sandboxfusion:1"
    assert await avail.image_for("python", "Bearer b") is None
    assert seen.probes == [("Bearer a", "sandboxfusion:1")]
