"""The unmodified ``sandbox-fusion`` client (and verl's raw request) against dsec's
SandboxFusion routes, on a real server with real fncall workers.

CI has only the base image (python:3.11): python, pytest-less python, bash, perl, C and C++
run; every other language answers "not available" here (``make images`` builds
``sandboxfusion:1`` with the rest; tests/integrations/test_sandboxfusion_image.py runs
them when that image is present).
"""

from __future__ import annotations

import base64

import pytest
import requests
import sandbox_fusion as sf
from sandbox_fusion import RunCodeRequest, RunStatus

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def endpoint(fn_server):
    return f"{fn_server.url}/sandboxfusion/{fn_server.token}"


def run(endpoint, **kw):
    return sf.run_code(RunCodeRequest(**kw), endpoint=endpoint, max_attempts=1)


def test_python_print(endpoint):
    r = run(endpoint, code="print(1+1)", language="python")
    assert r.status == RunStatus.Success
    assert (r.run_result.status, r.run_result.return_code, r.run_result.stdout) == \
        ("Finished", 0, "2\n")
    assert r.compile_result is None


async def test_async_client(endpoint):
    from sandbox_fusion import run_code_async
    r = await run_code_async(RunCodeRequest(code="import sys; print(sys.stdin.read()[::-1])",
                                            stdin="abc", language="python"),
                             endpoint=endpoint, max_attempts=1)
    assert r.run_result.stdout == "cba\n"


def test_cpp_compiles_and_reads_stdin(endpoint):
    code = "#include <iostream>\nint main(){int a,b;std::cin>>a>>b;std::cout<<a+b<<'\\n';}"
    r = run(endpoint, code=code, language="cpp", stdin="20 22")
    assert r.status == RunStatus.Success, r
    assert (r.compile_result.status, r.compile_result.return_code) == ("Finished", 0)
    assert r.run_result.stdout == "42\n"


def test_compile_error_has_no_run(endpoint):
    r = run(endpoint, code="int main( { return 0; }", language="cpp")
    assert r.status == RunStatus.Failed
    assert r.compile_result.return_code != 0 and "error" in r.compile_result.stderr
    assert r.run_result is None


def test_nonzero_exit_is_failed(endpoint):
    r = run(endpoint, code="echo out; echo err >&2; exit 3", language="bash")
    assert r.status == RunStatus.Failed
    assert (r.run_result.return_code, r.run_result.stdout, r.run_result.stderr) == \
        (3, "out\n", "err\n")


def test_run_timeout(endpoint):
    r = run(endpoint, code="import time; time.sleep(30)", language="python", run_timeout=1)
    assert r.status == RunStatus.Failed
    assert r.run_result.status == "TimeLimitExceeded"


def test_compiled_run_timeout(endpoint):
    r = run(endpoint, code="int main(){for(;;);}", language="cpp", run_timeout=1)
    assert r.status == RunStatus.Failed
    assert r.compile_result.return_code == 0
    assert r.run_result.status == "TimeLimitExceeded"


def test_files_in_and_fetched(endpoint):
    data = base64.b64encode(b"hello\n").decode()
    r = run(endpoint, language="python", files={"in/data.txt": data},
            code="open('out.txt','w').write(open('in/data.txt').read().upper())",
            fetch_files=["out.txt", "missing.txt"])
    assert r.status == RunStatus.Success, r
    assert base64.b64decode(r.files["out.txt"]) == b"HELLO\n"
    assert "missing.txt" not in r.files


def test_perl_from_the_base_image(endpoint):
    r = run(endpoint, code='print "p", 6*7, "\\n";', language="perl")
    assert r.run_result.stdout == "p42\n"


def test_language_not_available(endpoint):
    with pytest.raises(Exception, match="language 'go' is not available.*make images"):
        run(endpoint, code="package main\nfunc main(){}", language="go")
    with pytest.raises(Exception, match="'julia' is not available on dsec: Debian"):
        run(endpoint, code="println(1)", language="julia")


def test_unknown_language_answers_422_detail(endpoint):
    resp = requests.post(f"{endpoint}/run_code", json={"code": "x", "language": "cobol"})
    assert resp.status_code == 422
    [err] = resp.json()["detail"]
    assert err["loc"] == ["body", "language"] and "python" in err["msg"]


def test_bad_file_path_answers_422(endpoint):
    resp = requests.post(f"{endpoint}/run_code", json={
        "code": "print(1)", "language": "python",
        "files": {"../escape.txt": base64.b64encode(b"x").decode()}})
    assert resp.status_code == 422
    assert "relative" in str(resp.json()["detail"])


def test_wrong_token_is_the_clients_auth_error(fn_server):
    with pytest.raises(Exception, match="401"):
        run(f"{fn_server.url}/sandboxfusion/wrong-token", code="print(1)", language="python")


def test_output_over_the_limit_is_an_error(endpoint):
    with pytest.raises(Exception, match="more than 8388608 bytes to stdout"):
        run(endpoint, code="import sys; sys.stdout.write('x' * (9 << 20))", language="python")


def test_fetched_file_over_the_limit_is_an_error(endpoint):
    with pytest.raises(Exception, match="file 'big.bin' holds 17825792 bytes"):
        run(endpoint, code="open('big.bin','wb').write(b'x' * (17 << 20))", language="python",
            fetch_files=["big.bin"])


def test_verl_request(endpoint):
    """verl's call_sandbox_api: a raw POST of its payload to the run_code URL."""
    payload = {"compile_timeout": 10, "run_timeout": 10, "code": "print(input()*2)",
               "stdin": "ab", "language": "python", "files": {}, "fetch_files": []}
    resp = requests.post(f"{endpoint}/run_code", json=payload, timeout=30)
    resp.raise_for_status()
    body = resp.json()
    assert body["status"] == "Success" and body["run_result"]["stdout"] == "abab\n"


def test_ping_and_jupyter(endpoint):
    assert requests.get(f"{endpoint}/v1/ping").json() == "pong"
    with pytest.raises(Exception, match="run_jupyter is not available"):
        sf.run_jupyter(sf.RunJupyterRequest(cells=["1"]), endpoint=endpoint, max_attempts=1)
