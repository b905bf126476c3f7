"""One agent connection carries command after command, and a vfork child stays its own.

The node hands the connection of a plain command that ended back to an :class:`AgentPool`
and starts the next command to that agent on it. What it sent for the old command and the
agent had not read (end of input, a signal sent as it exited, stdin it never took) must
never reach the next one; an idle connection the agent dropped must not fail the next
exec. Commands are started with vfork: what a child sets (its user, its environment)
must stay the child's. The real agent binary serves a unix socket on the host here.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from dsec.node.agent.build import ensure_agent
from dsec.node.agent.client import HEADER, AgentPool, AgentProcess, SpawnRequest, unix_connector

ENV = {"PATH": "/usr/bin:/bin"}


class Agent:
    """A dsec-agent serving ``path``; restartable on the same path."""

    def __init__(self, binary: Path, path: Path) -> None:
        self.binary, self.path, self.proc = binary, path, None

    def start(self) -> None:
        self.path.unlink(missing_ok=True)
        self.proc = subprocess.Popen([str(self.binary), "serve-unix", str(self.path)])
        for _ in range(500):
            if self.path.exists():
                return
            time.sleep(0.01)
        raise AssertionError("the agent did not listen")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def threads(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/task"))


@pytest.fixture
def agent(tmp_path: Path):
    a = Agent(ensure_agent(tmp_path / "bin"), tmp_path / "agent.sock")
    a.start()
    try:
        yield a
    finally:
        a.stop()


async def run(connector, argv: list[str], env: dict | None = None, **kw) -> tuple[int, str]:
    proc = await AgentProcess.start(connector, SpawnRequest(argv=argv, env=ENV if env is None
                                                            else env, **kw), no_stdin=True)
    out = b""
    while (ev := await proc.next_event())[0] != "exit":
        out += ev[1] if ev[0] == "stdout" else b""
    return proc.exit_code, out.decode()


def test_commands_reuse_one_connection_and_one_agent_thread(agent):
    async def main():
        pool = AgentPool()
        connector = unix_connector(str(agent.path), pool)
        assert await run(connector, ["echo", "one"]) == (0, "one\n")
        assert len(pool._idle[str(agent.path)]) == 1
        for i in range(30):
            assert await run(connector, ["echo", str(i)]) == (0, f"{i}\n")
        # one thread serves the connection: the main one and that one
        assert agent.threads() == 2
        assert len(pool._idle[str(agent.path)]) == 1
        pool.drop(str(agent.path))

    asyncio.run(main())


def _frame(kind: bytes, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind[0], 0, len(payload)) + payload


def _read_until_exit(s: socket.socket) -> tuple[bytes, bytes]:
    out, buf = b"", b""
    while True:
        while len(buf) < HEADER.size or len(buf) < HEADER.size + HEADER.unpack(
                buf[:HEADER.size])[2]:
            chunk = s.recv(65536)
            assert chunk, "the agent closed the connection"
            buf += chunk
        kind, _chan, n = HEADER.unpack(buf[:HEADER.size])
        payload, buf = buf[HEADER.size:HEADER.size + n], buf[HEADER.size + n:]
        if kind == ord("O"):
            out += payload
        if kind == ord("X"):
            assert not buf
            return out, payload


def test_frames_for_an_ended_command_never_reach_the_next(agent):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(str(agent.path))
    s.settimeout(10)
    first = SpawnRequest(argv=["true"], env=ENV).encode(reuse=True)
    s.sendall(_frame(b"S", first) + _frame(b"E"))
    assert _read_until_exit(s) == (b"", b"0 0")
    # what a node could still have sent for the first command: stdin, its end, a kill,
    # an interrupt of its children, a resize
    s.sendall(_frame(b"I", b"stale\n") + _frame(b"E") + _frame(b"K", bytes([signal.SIGKILL]))
              + _frame(b"C", bytes([signal.SIGKILL])) + _frame(b"Z", b"10 10"))
    second = SpawnRequest(argv=["sh", "-c", "read x; sleep 0.2; echo got:$x"],
                          env=ENV).encode(reuse=True)
    s.sendall(_frame(b"S", second) + _frame(b"I", b"fresh\n") + _frame(b"E"))
    assert _read_until_exit(s) == (b"got:fresh\n", b"0 0")
    s.close()


def test_a_connection_the_agent_dropped_while_idle_is_not_an_error(agent):
    async def main():
        pool = AgentPool()
        connector = unix_connector(str(agent.path), pool)
        assert await run(connector, ["echo", "a"]) == (0, "a\n")
        agent.stop()  # its idle connection goes with it
        agent.start()
        assert await run(connector, ["echo", "b"]) == (0, "b\n")
        pool.drop(str(agent.path))

    asyncio.run(main())


def test_a_childs_user_and_environment_stay_its_own(agent):
    async def main():
        pool = AgentPool()
        connector = unix_connector(str(agent.path), pool)
        assert await run(connector, ["id", "-u"], uid=65534, gid=65534) == (0, "65534\n")
        assert await run(connector, ["id", "-u"]) == (0, "0\n")
        assert await run(connector, ["sh", "-c", "echo $ONLY_HERE"],
                         env={**ENV, "ONLY_HERE": "x"}) == (0, "x\n")
        # no env of its own: the command gets the agent's, which the last one left alone
        assert await run(connector, ["sh", "-c", "echo ${ONLY_HERE:-unset}"], env={}) \
            == (0, "unset\n")
        pool.drop(str(agent.path))

    asyncio.run(main())
