"""The agent closes each fd of a command once, so one command never reaches another's.

Regression: a pty's master was closed when its output ended, and closed again when the
client then sent end-of-input; by then the number could belong to the next connection,
which lost its socket (or, for a write, received the first command's stdin).
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest

from dsec.node.agent.build import ensure_agent
from dsec.node.agent.client import HEADER, SpawnRequest
from dsec.node.backends.microvm.agentsync import SyncCommand

ENV = {"PATH": "/usr/bin:/bin"}


@pytest.fixture
def agent_socket(tmp_path: Path):
    binary = ensure_agent(tmp_path / "bin")
    sock = tmp_path / "agent.sock"
    proc = subprocess.Popen([str(binary), "serve-unix", str(sock)])
    for _ in range(1000):  # the file appears at bind(), a moment before listen()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.connect(str(sock))
            break
        except OSError:
            time.sleep(0.01)
    try:
        yield str(sock)
    finally:
        proc.kill()
        proc.wait()


def _connector(path: str):
    def connect() -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        s.settimeout(10)
        return s
    return connect


def _frame(kind: bytes, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind[0], 0, len(payload)) + payload


def test_end_of_input_after_a_pty_closes_never_reaches_the_next_command(agent_socket):
    connect = _connector(agent_socket)
    pty = connect()
    # the command lets go of its terminal and keeps running (deaf to the hangup that
    # closing the master sends): the pty's output ends first
    script = "trap '' HUP; exec </dev/null >/dev/null 2>&1; sleep 2"
    req = SpawnRequest(argv=["sh", "-c", script], env=ENV, pty=True)
    pty.sendall(_frame(b"S", req.encode()))
    assert pty.recv(HEADER.size)[0] == ord("P")
    time.sleep(0.5)  # the agent sees the pty's end of output
    other = SyncCommand(connect, ["cat"], env=ENV)  # may get the fd number the pty had
    pty.sendall(_frame(b"E"))  # end of input on the finished pty
    time.sleep(0.2)
    assert other.run(b"still mine") == (0, b"still mine", b"")
    pty.close()


def test_commands_keep_their_own_stdin_under_concurrency(agent_socket):
    connect = _connector(agent_socket)
    cmds = [SyncCommand(connect, ["cat"], env=ENV) for _ in range(8)]
    for i, cmd in enumerate(cmds):
        cmd.write(f"payload {i}".encode())
    for i, cmd in enumerate(cmds):
        assert cmd.run() == (0, f"payload {i}".encode(), b"")


def test_a_first_frame_that_is_not_a_spawn_is_refused_and_harms_nothing(agent_socket):
    connect = _connector(agent_socket)
    held = SyncCommand(connect, ["cat"], env=ENV)  # a command whose fds must stay its own
    for kind in b"IEKCZX?":
        s = connect()
        s.sendall(_frame(bytes([kind]), b"0 0"))
        assert s.recv(HEADER.size)[0] == ord("F")
        s.close()
    assert held.run(b"intact") == (0, b"intact", b"")
