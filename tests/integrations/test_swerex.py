"""SWE-ReX's deployment and runtime interfaces on a real dsec server, driven through
SWE-ReX's own request models and exceptions (the ``swe-rex`` package)."""

from __future__ import annotations

import asyncio

import pytest
from swerex.exceptions import (BashIncorrectSyntaxError, CommandTimeoutError,
                               DeploymentNotStartedError, NonZeroExitCodeError,
                               SessionDoesNotExistError, SessionExistsError)
from swerex.runtime.abstract import (BashAction, CloseBashSessionRequest, Command,
                                     CreateBashSessionRequest, ReadFileRequest, UploadRequest,
                                     WriteFileRequest)

import dsec
from dsec.integrations.swerex import DsecDeployment

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
async def deployment(fn_server):
    d = DsecDeployment(image="python:3.11", url=fn_server.url, token=fn_server.token)
    await d.start()
    await d.runtime.create_session(CreateBashSessionRequest())
    yield d
    await d.stop()


def A(command: str, **kw) -> BashAction:
    return BashAction(command=command, timeout=30, **kw)


async def test_not_started_raises_swerexs_error(fn_server):
    d = DsecDeployment(url=fn_server.url, token=fn_server.token)
    with pytest.raises(DeploymentNotStartedError):
        d.runtime


async def test_stop_ends_the_sandbox(fn_server):
    d = DsecDeployment(url=fn_server.url, token=fn_server.token)
    await d.start()
    sb_id = d.sandbox_id
    assert await d.is_alive()
    await d.stop()
    async with dsec.AsyncClient(fn_server.url, fn_server.token) as c:
        with pytest.raises(dsec.NotFound):
            await c.get(sb_id)


async def test_session_keeps_bash_state(deployment):
    rt = deployment.runtime
    await rt.run_in_session(A("cd /tmp && x=42 && export Y=7 && f() { echo fn$1; }"))
    r = await rt.run_in_session(A("echo $PWD $x $Y; f 1; A=(a b); echo ${A[1]}"))
    assert r.output == "/tmp 42 7\nfn1\nb\n"
    r = await rt.run_in_session(A("for i in {1..3}; do echo -n $i; done; [[ 1 == 1 ]] && echo"))
    assert (r.output, r.exit_code) == ("123\n", 0)


async def test_sessions_are_isolated(deployment):
    rt = deployment.runtime
    await rt.create_session(CreateBashSessionRequest(session="b"))
    await asyncio.gather(rt.run_in_session(A("x=1")), rt.run_in_session(A("x=2", session="b")))
    assert (await rt.run_in_session(A("echo $x"))).output == "1\n"
    assert (await rt.run_in_session(A("echo $x", session="b"))).output == "2\n"
    with pytest.raises(SessionExistsError):
        await rt.create_session(CreateBashSessionRequest(session="b"))
    await rt.close_session(CloseBashSessionRequest(session="b"))
    with pytest.raises(SessionDoesNotExistError):
        await rt.run_in_session(A("true", session="b"))


async def test_exit_codes_and_merged_output(deployment):
    rt = deployment.runtime
    r = await rt.run_in_session(A("echo out; echo err >&2; false", check="silent"))
    assert (r.output, r.exit_code) == ("out\nerr\n", 1)
    with pytest.raises(NonZeroExitCodeError, match="exit code 3"):
        await rt.run_in_session(A("exit 3"))
    assert (await rt.run_in_session(A("echo still here"))).output == "still here\n"
    assert (await rt.run_in_session(A("false", check="ignore"))).exit_code is None


async def test_syntax_error_is_refused_before_running(deployment):
    with pytest.raises(BashIncorrectSyntaxError) as e:
        await deployment.runtime.run_in_session(A("touch /tmp/ran; (a"))
    assert "syntax error" in e.value.extra_info["bash_stderr"]
    assert (await deployment.runtime.execute(Command(command=["ls", "/tmp/ran"]))).exit_code != 0


async def test_timeout_kills_the_command_not_the_session(deployment):
    rt = deployment.runtime
    with pytest.raises(CommandTimeoutError):
        await rt.run_in_session(BashAction(command="x=5; sleep 30", timeout=0.5))
    assert (await rt.run_in_session(A("echo ok"))).output == "ok\n"


async def test_startup_source(deployment):
    rt = deployment.runtime
    await rt.write_file(WriteFileRequest(path="/root/env.sh", content="export FROM_RC=yes\n"))
    await rt.create_session(CreateBashSessionRequest(session="rc",
                                                     startup_source=["/root/env.sh"]))
    assert (await rt.run_in_session(A("echo $FROM_RC", session="rc"))).output == "yes\n"


async def test_execute(deployment):
    rt = deployment.runtime
    r = await rt.execute(Command(command="echo $0 $HOME; pwd", shell=True, cwd="/tmp"))
    assert r.stdout == "/bin/sh /root\n/tmp\n"
    r = await rt.execute(Command(command=["sh", "-c", "echo o; echo e >&2"],
                                 merge_output_streams=True))
    assert (r.stdout, r.stderr) == ("o\ne\n", "")
    r = await rt.execute(Command(command=["printenv", "K"], env={"K": "v"}))
    assert r.stdout == "v\n"
    with pytest.raises(CommandTimeoutError):
        await rt.execute(Command(command=["sleep", "10"], timeout=0.2))
    with pytest.raises(NonZeroExitCodeError):
        await rt.execute(Command(command=["false"], check=True))


async def test_files(deployment, tmp_path):
    rt = deployment.runtime
    await rt.write_file(WriteFileRequest(path="/work/new/dir/a.txt", content="héllo"))
    assert (await rt.read_file(ReadFileRequest(path="/work/new/dir/a.txt"))).content == "héllo"
    with pytest.raises(FileNotFoundError):
        await rt.read_file(ReadFileRequest(path="/nope.txt"))
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "sub" / "f.txt").write_text("in dir")
    (tmp_path / "one.txt").write_text("one")
    await rt.upload(UploadRequest(source_path=str(tmp_path / "d"), target_path="/up/d"))
    await rt.upload(UploadRequest(source_path=str(tmp_path / "one.txt"),
                                  target_path="/up/x/one.txt"))
    r = await rt.run_in_session(A("cat /up/d/sub/f.txt /up/x/one.txt"))
    assert r.output == "in dirone"


async def test_interactive_commands_are_unsupported(deployment):
    with pytest.raises(dsec.Unsupported, match="terminal"):
        await deployment.runtime.run_in_session(
            BashAction(command="python3", is_interactive_command=True, expect=[">>> "]))


async def test_busybox_sessions_use_sh(fn_server):
    """No bash, no Python in the image: the sh session itself keeps cwd and exports."""
    d = DsecDeployment(image="busybox", url=fn_server.url, token=fn_server.token,
                       memory_mb=128)
    await d.start()
    try:
        rt = d.runtime
        await rt.create_session(CreateBashSessionRequest())
        await rt.run_in_session(A("cd /tmp; export Z=9"))
        assert (await rt.run_in_session(A("echo $PWD $Z"))).output == "/tmp 9\n"
    finally:
        await d.stop()
