"""dsec shell on a real pseudo-terminal: raw mode, typing, resize, exit codes, and the
terminal given back exactly as it was (checked with ``stty -g`` before and after)."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import termios
from pathlib import Path

import pytest

from tests.cli.conftest import DSEC
from tests.cli.terminal import Terminal

PROMPT = b"/ # "


def _wrapped(dsec_args: list[str]) -> list[str]:
    """A host shell that prints the terminal settings around the dsec command."""
    cmd = shlex.join([*DSEC, *dsec_args])
    return ["sh", "-c", f"echo BEFORE=$(stty -g); {cmd}; echo RC=$?; echo AFTER=$(stty -g)"]


@pytest.fixture
def term_for(env):
    opened: list[Terminal] = []

    def start(*dsec_args: str) -> Terminal:
        t = Terminal(_wrapped(list(dsec_args)), env)
        opened.append(t)
        return t

    yield start
    for t in opened:
        t.close()


def test_interactive_session(term_for, sb):
    t = term_for("shell", sb.id)
    before = t.line_after(b"BEFORE=")
    t.read_until(PROMPT)
    assert not t.lflag() & (termios.ICANON | termios.ECHO)  # raw while the session runs

    mark = len(t.buf)
    t.type("echo $((6*7))\r")
    t.read_until(b"42\r\n", since=mark)

    t.resize(40, 120)  # SIGWINCH reaches dsec, which forwards the new size
    for _ in range(20):  # the resize frame may trail the first keystrokes; ask again
        mark = len(t.buf)
        t.type("stty size\r")
        # ash redraws the line when the resize lands mid-typing ("stty si\r/ # stty si\x1b[Jze",
        # anywhere in the word), with "\r" but never "\r\n": the first "\r\n" ends the echo
        end = t.read_until(PROMPT, since=t.read_until(b"\r\n", since=mark))
        if b"40 120" in t.buf[mark:end]:
            break
    else:
        raise AssertionError(f"the sandbox never saw the new size: {t.buf!r}")

    t.type("cd /tmp && export X=kept\r")
    mark = len(t.buf)
    t.type("echo $PWD-$X\r")
    t.read_until(b"/tmp-kept\r\n", since=mark)

    t.type("exit 5\r")
    assert t.line_after(b"RC=") == b"5"
    assert t.line_after(b"AFTER=") == before  # the terminal is exactly as it was
    assert t.wait() == 0


def test_unknown_sandbox_leaves_the_terminal_alone(term_for):
    t = term_for("shell", "sb-00000000-000000000000")
    before = t.line_after(b"BEFORE=")
    line = t.line_after(b"error: ")  # red on a terminal
    assert line.startswith(b"sandbox sb-00000000-000000000000 not found"), line
    assert t.line_after(b"RC=") == b"1"
    assert t.line_after(b"AFTER=") == before
    t.wait()


def test_sandbox_stopped_mid_session_restores_the_terminal(term_for, sb):
    t = term_for("shell", sb.id)
    before = t.line_after(b"BEFORE=")
    t.read_until(PROMPT)
    sb.stop()
    # the connection closed first ("was the sandbox stopped?"), or the shell's end came
    # first and the server said why ("sandbox ... was stopped while its terminal was open")
    assert b"stopped" in t.line_after(b"error: ")
    assert t.line_after(b"RC=") == b"1"
    assert t.line_after(b"AFTER=") == before
    t.wait()


def test_sigterm_restores_the_terminal(term_for, sb):
    t = term_for("shell", sb.id)
    before = t.line_after(b"BEFORE=")
    t.read_until(PROMPT)
    children = Path(f"/proc/{t.pid}/task/{t.pid}/children").read_text().split()
    assert len(children) == 1
    os.kill(int(children[0]), signal.SIGTERM)
    assert t.line_after(b"RC=") == str(128 + signal.SIGTERM).encode()
    assert t.line_after(b"AFTER=") == before
    t.wait()


def test_piped_input_without_a_terminal(env, sb):
    r = subprocess.run([*DSEC, "shell", sb.id], env=env, input="echo $((6*7))\nexit 3\n",
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, r.stderr
    assert "42" in r.stdout.split()


@pytest.mark.parametrize("script, code", [
    (None, 0),       # stdin is /dev/null: the shell ends at once
    ("false", 1),    # the last line has no newline: it still runs, its status is the shell's
    ("cat\n", 0),    # a command reading the terminal takes one Ctrl-D; the shell needs another
], ids=["devnull", "no-newline", "cat"])
def test_end_of_piped_input_ends_the_session(env, sb, script, code):
    r = subprocess.run([*DSEC, "shell", sb.id], env=env, input=script,
                       stdin=subprocess.DEVNULL if script is None else None,
                       capture_output=True, text=True, timeout=20)
    assert r.returncode == code, (r.stdout, r.stderr)
