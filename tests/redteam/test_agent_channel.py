"""The in-sandbox agent is out of reach of every process its commands start.

Each test runs a real attack from inside a real container sandbox, as root there with the
sandbox's default capabilities, and then checks that the node still gets genuine results.
The attacks come from ``probes/agent_attack.c``, built static on the host.
"""

from __future__ import annotations

import asyncio
import secrets

import pytest

import dsec
from tests.redteam.probes import build_probe
from tests.support.server import ServerProcess, leftovers

PROBE = "/tmp/agent_attack"


@pytest.fixture
async def armed(sandbox):
    """The sandbox with the attack program in it."""
    await sandbox.files.write(PROBE, build_probe("agent_attack").read_bytes())
    r = await sandbox.exec(["chmod", "755", PROBE])
    assert r.exit_code == 0, r
    return sandbox


def _attempts(out: str, what: str) -> list[tuple[int, str]]:
    rows = [line.split() for line in out.splitlines()]
    return [(int(pid), res) for kind, pid, res in rows if kind == what and pid != "-"]


async def _genuine(sb) -> None:
    token = f"genuine-{secrets.token_hex(4)}"
    r = await sb.exec(f"echo {token}", timeout=10)
    assert (r.exit_code, r.stdout) == (0, f"{token}\n"), r


async def test_agent_memory_cannot_be_opened(armed):
    r = await armed.exec([PROBE, "mem"], timeout=10)
    tried = _attempts(r.stdout, "mem")
    assert tried and 1 in {pid for pid, _ in tried}, r
    # nothing else runs in this sandbox: every other process it can see is the agent's
    assert "ok" not in dict(tried).values(), r


async def test_agent_file_descriptors_cannot_be_taken(armed):
    r = await armed.exec([PROBE, "getfd"], timeout=10)
    tried = dict(_attempts(r.stdout, "getfd"))
    assert tried.get(1) not in (None, "ok"), r
    assert "ok" not in tried.values(), r


async def test_agent_cannot_be_traced_or_read(armed):
    for what in ("ptrace", "vmread"):
        r = await armed.exec([PROBE, what], timeout=10)
        tried = dict(_attempts(r.stdout, what))
        assert tried.get(1) not in (None, "ok"), (what, r)
        assert "ok" not in tried.values(), (what, r)


async def test_a_forger_cannot_answer_the_nodes_exec(armed):
    r = await armed.exec([PROBE, "forge", "20"], timeout=10)
    assert "steal - no-listener" in r.stdout, r
    await _genuine(armed)
    # and from a detached background process, which outlives its exec
    await armed.exec([PROBE, "forge", "20"], background=True)
    await asyncio.sleep(0.5)
    for _ in range(3):
        await _genuine(armed)


async def test_agent_survives_signals_from_the_sandbox(armed):
    r = await armed.exec([PROBE, "signal"], timeout=10)
    assert any(pid == 1 for pid, _ in _attempts(r.stdout, "kill")), r
    await _genuine(armed)
    shell = await armed.shell()
    out = await shell.run("echo $((6*7))")
    assert out.stdout.strip() == "42", out


async def test_command_output_cannot_inject_frames(armed):
    # bytes shaped like the agent's own exit frame, written by the command itself
    fake_exit = "X\\000\\000\\000\\000\\000\\000\\000\\0030 0"
    r = await armed.exec(f"printf '{fake_exit}'; printf '{fake_exit}' >&2; exit 7", timeout=10)
    assert r.exit_code == 7 and not r.oom_killed and not r.stdout_truncated, r
    assert r.stdout.startswith("X") and r.stdout.endswith("0 0"), r
    assert r.stderr.startswith("X"), r


async def test_filling_the_pid_limit_does_not_forge_or_kill_the_agent(client):
    sb = await client.create(memory_mb=256, pids=64)
    try:
        # hold every free pid for a few seconds, then let go
        bomb = "i=0; while [ $i -lt 200 ]; do sleep 4 & i=$((i+1)); done 2>/dev/null; wait"
        await sb.exec(bomb, background=True)
        await asyncio.sleep(1.0)
        # a refusal that names the limit (409: the sandbox is alive), not a stopped sandbox
        with pytest.raises(dsec.Conflict, match="pids"):
            await sb.exec("echo during", timeout=10)
        await asyncio.sleep(4.5)
        await _genuine(sb)
    finally:
        await sb.stop()


@pytest.fixture(scope="module")
def fncall_server():
    srv = ServerProcess(backends=["fncall"]).start()
    yield srv
    srv.stop()  # its warm workers end with it
    left = leftovers(srv.state_dir)
    srv.destroy()
    assert not left, left


async def test_fncall_code_cannot_reach_its_workers_agent(fncall_server):
    async with dsec.AsyncClient(fncall_server.url, fncall_server.token, timeout=120) as client:
        await _fncall_attacks(client)


async def _fncall_attacks(client):
    probe = build_probe("agent_attack").read_bytes()
    script = ("chmod 755 ./agent_attack && for a in mem getfd ptrace vmread; do "
              "./agent_attack $a; done; ./agent_attack forge 5; ./agent_attack signal")
    r = await client.fncall(script, language="sh", image="busybox",
                            files={"agent_attack": probe}, timeout=20)
    for what in ("mem", "getfd", "ptrace", "vmread"):
        tried = dict(_attempts(r.stdout, what))  # the call's own shell is dumpable: only pid 1
        assert tried.get(1) not in (None, "ok"), (what, r)
    assert "steal - no-listener" in r.stdout, r
    token = f"genuine-{secrets.token_hex(4)}"
    for _ in range(3):  # the next calls, whichever worker serves them, are genuine
        again = await client.fncall(f"echo {token}", language="sh", image="busybox")
        assert (again.exit_code, again.stdout) == (0, f"{token}\n"), again
