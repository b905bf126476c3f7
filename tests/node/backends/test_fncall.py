"""The fncall backend end to end: a real server, real worker containers, the Debian image.

Each isolation test first pins a worker (a pool of its own, by a distinct memory size), lets
one call change something, then probes with the next call on the *same* worker (checked by
worker id), so a leak would be seen.
"""

from __future__ import annotations

import asyncio
import signal

import httpx
import pytest

import dsec
from dsec.api.fncall import FnCallRequest, RemoteError
from tests.support.images import ensure_debian_image
from tests.support.server import ServerProcess, leftovers

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def fn_server():
    srv = ServerProcess(backends=["container", "fncall"])
    ensure_debian_image(srv.state_dir)
    srv.start()
    yield srv
    srv.stop_all_sandboxes()
    srv.stop()  # closes the pools: every worker container is removed
    left = leftovers(srv.state_dir)
    srv.destroy()
    assert not left, f"fncall left things behind: {left}"


@pytest.fixture
async def fc(fn_server):
    async with dsec.AsyncClient(fn_server.url, fn_server.token) as c:
        yield c


async def same_worker(fc, first, probe: str, memory_mb: int, **kw):
    """Run ``probe`` until it lands on ``first``'s worker (pools rotate over idle ones)."""
    for _ in range(10):
        out = await fc.fncall(probe, memory_mb=memory_mb, **kw)
        if out.worker == first.worker:
            return out
    pytest.fail("the probe never ran on the worker of the first call")


# ---- what a call can do ----

async def test_python_code_runs(fc):
    out = await fc.fncall("print(sum(range(10)))")
    assert (out.exit_code, out.stdout) == (0, "45\n")


async def test_stdin_argv_input_and_returned_files(fc):
    code = ("import sys\ndata = open('in/data.txt').read()\n"
            "open('out.txt', 'w').write(data.upper() + sys.stdin.read() + sys.argv[1])\n")
    out = await fc.fncall(code, stdin="<stdin>", argv=["<argv>"],
                          files={"in/data.txt": b"hello"}, return_files=["out.txt"])
    assert out.exit_code == 0, out.stderr
    assert out.files == {"out.txt": b"HELLO<stdin><argv>"}


async def test_bash_c_and_cpp(fc):
    bash = await fc.fncall('read x; echo "$((x * 2)) $BASH_VERSION"; git --version',
                           language="bash", stdin="21\n")
    assert bash.stdout.startswith("42 5.") and "git version" in bash.stdout, bash
    c = await fc.fncall('#include <stdio.h>\nint main(){int a; scanf("%d",&a);'
                        'printf("%d\\n", a * 3); return 0;}', language="c", stdin="14")
    assert (c.exit_code, c.stdout) == (0, "42\n"), c.stderr
    cpp = await fc.fncall('#include <iostream>\n#include <vector>\nint main(){'
                          'std::vector<int> v{1,2,3}; int s=0; for(int x: v) s+=x;'
                          'std::cout << s << std::endl;}', language="cpp")
    assert (cpp.exit_code, cpp.stdout) == (0, "6\n"), cpp.stderr
    bad = await fc.fncall("int main( {", language="c")
    assert bad.compile_failed and bad.exit_code != 0 and "error" in bad.stderr


async def test_callable_by_value_and_remote_traceback(fc):
    def add(a, b, scale=1):
        return {"sum": (a + b) * scale}

    assert await fc.fncall(add, 3, 4, kwargs={"scale": 2}) == {"sum": 14}

    def boom(x):
        raise ValueError(f"bad input {x}")

    with pytest.raises(RemoteError) as info:
        await fc.fncall(boom, 7)
    assert "bad input 7" in str(info.value)
    assert "in boom" in info.value.remote_traceback


async def test_fncall_many_keeps_order(fc):
    solution = "import sys\na, b = map(int, sys.stdin.read().split())\nprint(a + b)\n"
    reqs = [FnCallRequest(code=solution, stdin=f"{i} {i}".encode()) for i in range(12)]
    outs = await fc.fncall_many(reqs)
    assert [o.stdout for o in outs] == [f"{2 * i}\n" for i in range(12)]


async def test_fncall_sandbox_exec_keeps_no_state(fc):
    sb = await fc.create(backend="fncall", image="python:3.11", memory_mb=200)
    try:
        r1 = await sb.exec("echo hi > f && cat f && export Y=1")
        assert (r1.exit_code, r1.stdout) == (0, "hi\n")
        r2 = await sb.exec("cat f; echo \"Y=$Y\"")
        assert r2.exit_code == 0 and "hi" not in r2.stdout and "Y=\n" in r2.stdout
        events = [ev async for ev in sb.exec_stream("echo streamed; exit 3")]
        assert events[0].data == "streamed\n" and events[-1].result.exit_code == 3
        with pytest.raises(dsec.Unsupported):
            await sb.shell()
    finally:
        await sb.stop()


# ---- isolation: nothing reaches the next call ----

async def test_files_do_not_reach_the_next_call(fc):
    write = ("import os\nfor p in ('left.txt', '/tmp/left', '/var/tmp/left', '/dev/shm/left'):"
             "\n    open(p, 'w').write('x')\nos.makedirs('/tmp/dir/sub')\nprint(os.getcwd())\n")
    first = await fc.fncall(write, memory_mb=201)
    assert first.exit_code == 0, first.stderr
    probe = ("import os\nprint([p for p in ('left.txt', '/tmp/left', '/var/tmp/left', "
             "'/dev/shm/left', '/tmp/dir') if os.path.exists(p)], sorted(os.listdir('.')))")
    out = await same_worker(fc, first, probe, 201)
    assert out.stdout == "[] []\n"


async def test_processes_do_not_reach_the_next_call(fc):
    spawn = "setsid nohup sleep 1000 >/dev/null 2>&1 &\n(sleep 999 &) ; echo started"
    first = await fc.fncall(spawn, language="bash", memory_mb=202)
    assert first.stdout == "started\n"
    probe = ("import os\nprint([open(f'/proc/{p}/cmdline').read() for p in os.listdir('/proc')"
             " if p.isdigit() and 'sleep' in open(f'/proc/{p}/cmdline').read()])")
    out = await same_worker(fc, first, probe, 202)
    assert out.stdout == "[]\n", out


async def test_env_globals_and_cwd_do_not_reach_the_next_call(fc):
    change = ("import os, json, sys\nos.environ['LEAK'] = '1'\njson.LEAK = 1\n"
              "sys.modules['leaky'] = json\nos.chdir('/')\nprint('ok')")
    first = await fc.fncall(change, memory_mb=203)
    assert first.stdout == "ok\n"
    probe = ("import os, json, sys\nprint(os.environ.get('LEAK'), hasattr(json, 'LEAK'), "
             "'leaky' in sys.modules, os.getcwd())")
    out = await same_worker(fc, first, probe, 203)
    assert out.stdout == "None False False /fn/call\n"


# ---- limits ----

async def test_no_network(fc):
    code = ("import os, socket\nprint(sorted(os.listdir('/sys/class/net')))\n"
            "s = socket.socket()\ns.settimeout(3)\n"
            "try:\n    s.connect(('1.1.1.1', 53)); print('connected')\n"
            "except OSError as e:\n    print('refused', e.errno)\n")
    out = await fc.fncall(code)
    assert out.stdout.startswith("['lo']\nrefused"), out


async def test_cpu_time_limit_kills_and_pool_carries_on(fc):
    out = await fc.fncall("while True: pass", cpu_time_s=1, timeout=30, memory_mb=204)
    assert out.timed_out and out.signal == signal.SIGXCPU
    nxt = await fc.fncall("print('alive')", memory_mb=204)
    assert nxt.stdout == "alive\n" and nxt.worker != out.worker


async def test_hang_is_killed_and_worker_replaced(fc):
    out = await fc.fncall("import time\ntime.sleep(600)", timeout=1, memory_mb=205)
    assert out.timed_out and out.duration_ms < 60_000
    nxt = await fc.fncall("print('alive')", memory_mb=205)
    assert nxt.stdout == "alive\n" and nxt.worker != out.worker


async def test_crash_is_reported_and_worker_replaced(fc):
    out = await fc.fncall("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)",
                          memory_mb=206)
    assert out.signal == signal.SIGSEGV and not out.timed_out
    nxt = await fc.fncall("print('alive')", memory_mb=206)
    assert nxt.stdout == "alive\n" and nxt.worker != out.worker


async def test_memory_exhaustion_is_oom_killed(fc):
    code = "x = []\nwhile True:\n    x.append(bytearray(8 << 20))\n"
    out = await fc.fncall(code, memory_mb=64, timeout=30)
    assert out.oom_killed and out.signal == signal.SIGKILL, out
    nxt = await fc.fncall("print('alive')", memory_mb=64)
    assert nxt.stdout == "alive\n"


async def test_pids_limit(fc):
    code = ("import os, time\nn = 0\ntry:\n    for _ in range(100):\n"
            "        if os.fork() == 0:\n            time.sleep(30); os._exit(0)\n"
            "        n += 1\nexcept OSError as e:\n    print('stopped', n, e.errno)\n")
    out = await fc.fncall(code, pids=8, timeout=20)
    assert out.stdout.startswith("stopped "), out
    assert int(out.stdout.split()[1]) < 8


async def test_output_is_capped(fc):
    out = await fc.fncall("import sys\nsys.stdout.write('x' * (8 << 20))", max_output=1000)
    assert out.exit_code == 0 and out.stdout_truncated and out.stdout == "x" * 1000


async def test_disk_limit(fc):
    code = ("n = 0\ntry:\n    for i in range(64):\n        with open(f'f{i}', 'wb') as f:\n"
            "            f.write(b'x' * (1 << 20)); n += 1\n"
            "except OSError as e:\n    print('full', n, e.errno)\n")
    out = await fc.fncall(code, disk_mb=8, memory_mb=207)
    assert out.stdout.startswith("full "), out
    assert int(out.stdout.split()[1]) <= 16


async def test_busybox_runs_sh_with_the_same_isolation(fc):
    out = await fc.fncall('read x; echo "got $x" > out.txt; id -u; sleep 500 &', language="sh",
                          image="busybox", stdin="7\n", return_files=["out.txt"], memory_mb=208)
    assert out.exit_code == 0 and out.files == {"out.txt": b"got 7\n"}, out
    assert int(out.stdout) >= 200_000  # the worker's own unprivileged uid
    probe = "ls -A . /tmp; ps -o comm | grep -c sleep"
    nxt = await same_worker(fc, out, probe, 208, language="sh", image="busybox")
    assert nxt.stdout.split() == [".:", "main.sh", "/tmp:", "0"], nxt
    hang = await fc.fncall("sleep 600", language="sh", image="busybox", timeout=1,
                           memory_mb=208)
    assert hang.timed_out
    with pytest.raises(dsec.InvalidArgument, match="no python3"):
        await fc.fncall("print(1)", image="busybox")


# ---- pools ----

async def test_idle_pool_gives_its_workers_back(tmp_path):
    from dsec.images import ImageService
    from dsec.node.agent.build import ensure_agent
    from dsec.node.backends.fncall import FncallBackend

    images = ImageService(tmp_path)
    images.ensure_busybox()
    backend = FncallBackend(tmp_path, images, ensure_agent(tmp_path / "bin"), warm=1,
                            idle_s=0.5)
    try:
        out = await backend.call(FnCallRequest(language="sh", code="echo hi", image="busybox"))
        assert out.stdout == "hi\n"
        assert (tmp_path / "sandboxes" / out.worker).is_dir()
        def gone() -> bool:  # the pool is dropped first, its workers stopped after
            return not backend.pools and not (tmp_path / "sandboxes" / out.worker).exists()

        for _ in range(100):
            if gone():
                break
            await asyncio.sleep(0.1)
        assert gone()
    finally:
        await backend.close()
        left = leftovers(tmp_path)
        images.unmount_all()
    assert not left


def test_workers_of_a_crashed_node_are_removed_on_restart(tmp_path):
    import httpx
    srv = ServerProcess(state_dir=tmp_path, backends=["container", "fncall"]).start()
    try:
        out = httpx.post(f"{srv.url}/v1/fncall", json={"language": "sh", "code": "echo hi",
                                                        "image": "busybox"},
                         headers={"authorization": f"Bearer {srv.token}"}, timeout=60).json()
        assert out["stdout"] == "hi\n"
        srv.kill()  # SIGKILL: the worker containers outlive it
        assert leftovers(tmp_path), "the kill should have left the workers running"
        srv.start()
        assert not leftovers(tmp_path)
    finally:
        srv.destroy()


async def test_a_batch_with_crashes_and_hangs_completes(fc):
    def call(i: int) -> FnCallRequest:
        if i % 5 == 1:
            return FnCallRequest(code="import os\nos.abort()", memory_mb=209)
        if i % 5 == 3:
            return FnCallRequest(code="while True: pass", timeout=1, memory_mb=209)
        return FnCallRequest(code=f"print({i})", memory_mb=209)

    outs = await fc.fncall_many([call(i) for i in range(20)])
    for i, out in enumerate(outs):
        if i % 5 == 1:
            assert out.signal == signal.SIGABRT, out
        elif i % 5 == 3:
            assert out.timed_out, out
        else:
            assert out.stdout == f"{i}\n", out
    assert (await fc.fncall("print('after')", memory_mb=209)).stdout == "after\n"


DEEP = 1500  # past Python's recursion limit (1000), where 3.11's rmtree and os.walk end


async def test_a_deep_tree_is_cleaned_and_the_worker_carries_on(fc):
    deep = ("import os\nfor top in ('.', '/tmp'):\n    p = os.open(top, os.O_RDONLY)\n"
            f"    for _ in range({DEEP}):\n        os.mkdir('d', dir_fd=p)\n"
            "        q = os.open('d', os.O_RDONLY, dir_fd=p); os.close(p); p = q\n"
            "    os.close(p)\nopen('out.txt', 'w').write('made')\nprint('done')\n")
    first = await fc.fncall(deep, return_files=["out.txt"], memory_mb=209, timeout=60)
    assert (first.exit_code, first.stdout) == (0, "done\n"), first
    assert first.files == {"out.txt": b"made"}
    probe = "import os\nprint(os.path.exists('/tmp/d'), sorted(os.listdir('.')))"
    out = await same_worker(fc, first, probe, 209)
    assert out.stdout == "False []\n", out


async def test_a_deep_tree_is_cleaned_by_a_busybox_worker(fc):
    deep = (f"for top in . /tmp; do (cd $top && i=0; while [ $i -lt {DEEP} ]; do "
            "mkdir d && cd d || exit 1; i=$((i+1)); done); done; echo made > out.txt; echo done")
    first = await fc.fncall(deep, language="sh", image="busybox", return_files=["out.txt"],
                            memory_mb=210, timeout=60)
    assert (first.exit_code, first.stdout) == (0, "done\n"), first
    assert first.files == {"out.txt": b"made\n"}
    nxt = await same_worker(fc, first, "ls -A . /tmp", 210, language="sh", image="busybox")
    assert nxt.stdout.split() == [".:", "main.sh", "/tmp:"], nxt


async def test_a_deep_input_file_path_is_refused_and_the_pool_carries_on(fn_server, fc):
    """Input files build the call's directory on the node: a path thousands of directories
    deep (past 3.11's os.walk recursion) is refused by name before any worker sees it,
    from the SDK and from a raw request alike."""
    deep = {"d/" * DEEP + "f": b"x"}
    with pytest.raises(dsec.InvalidArgument, match="directories deep; at most"):
        await fc.fncall("print(1)", files=deep, memory_mb=211)
    async with httpx.AsyncClient(base_url=fn_server.url, timeout=120,
                                 headers={"Authorization": f"Bearer {fn_server.token}"}) as h:
        r = await h.post("/v1/fncall", json={"code": "print(1)", "memory_mb": 211,
                                             "files": {k: "eA==" for k in deep}})
    assert r.status_code == 400 and "directories deep; at most" in r.text, r.text
    ok = await fc.fncall("print(open('d/' * 64 + 'f').read())",
                         files={"d/" * 64 + "f": b"deep enough"}, memory_mb=211)
    assert (ok.exit_code, ok.stdout) == (0, "deep enough\n"), ok
