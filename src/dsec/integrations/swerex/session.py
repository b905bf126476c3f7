"""A SWE-ReX bash session on a dsec shell: what runs in the shell for each action. Pure.

A dsec shell is a long-lived ``/bin/sh`` fed one command at a time (stdin /dev/null). SWE-ReX
sessions are bash, so when the image has bash each action runs as one ``bash -c`` in that
shell, which first restores the session's state (variables, functions, aliases, shell
options, cwd) from a file in the sandbox and saves it again after the command: the session
behaves as one bash, and a command that kills its bash loses nothing but itself. Without
bash (busybox) the command runs in the sh itself, whose cwd and exports persist natively.
Before running, the command is checked with ``bash -n`` (as SWE-ReX's own runtime does), in
the same round trip; stderr is merged into stdout, as a terminal shows it.
"""

from __future__ import annotations

import secrets

__all__ = ["STATE_DIR", "SYNTAX_MARK", "bash_line", "sh_line", "init_line"]

STATE_DIR = "/tmp/.dsec-swerex"
SYNTAX_MARK = "__DSEC_SWEREX_SYNTAX__"
# bash's own and per-process variables: restoring them fails (read-only) or lies
_VOLATILE = ("BASH*|SHELLOPTS|EUID|PPID|UID|GROUPS|FUNCNAME|PIPESTATUS|RANDOM|SRANDOM|"
             "LINENO|SECONDS|EPOCH*|HISTCMD|SHLVL|PWD|OLDPWD|_|COMP_WORDBREAKS|DIRSTACK|"
             "__dsec_*")


def _heredoc(text: str) -> tuple[str, str]:
    tag = f"__DSEC_{secrets.token_hex(8)}__"
    return f"<<'{tag}'\n{text}\n{tag}\n", tag


def _save(state: str) -> str:
    return (f'__dsec_rc=$?; {{ for __dsec_v in $(compgen -v); do case $__dsec_v in '
            f'{_VOLATILE}) ;; *) declare -p "$__dsec_v" 2>/dev/null;; esac; done; '
            f'declare -f; alias -p; shopt -p; set +o; }} >"{state}.env" 2>/dev/null; '
            f'pwd >"{state}.cwd"; exit $__dsec_rc')


def _restore(state: str) -> str:
    return (f'[ -r "{state}.env" ] && . "{state}.env" >/dev/null 2>&1; '
            f'[ -r "{state}.cwd" ] && cd "$(cat "{state}.cwd")" 2>/dev/null; exec 2>&1')


def bash_line(session: str, command: str) -> str:
    """The shell line that checks ``command`` and runs it in ``session``'s bash state."""
    state = f"{STATE_DIR}/{session}"
    body = f"{_restore(state)}\n{command}\n{_save(state)}"
    doc, _ = _heredoc(body)
    # the check: bash -n on the command alone, so its message quotes the caller's lines
    check, _ = _heredoc(command)
    return (f"__dsec_w=$(cat {doc})\n"
            f"if __dsec_e=$(bash -n 2>&1 {check}); then "
            f'bash --norc --noprofile -c "$__dsec_w"; '
            f"else printf '%s\\n{SYNTAX_MARK}\\n' \"$__dsec_e\" >&2; false; fi")


def sh_line(command: str) -> str:
    """Without bash: the command in the sh session itself, stderr merged."""
    return f"{{ {command}\n}} 2>&1"


def init_line(session: str, startup_source: list[str]) -> str:
    """A fresh state for ``session``, with ``startup_source`` files sourced into it."""
    state = f"{STATE_DIR}/{session}"
    sources = "".join(f". {_quote(p)}\n" for p in startup_source)
    body = f"{sources}{_save(state)}"
    doc, _ = _heredoc(body)
    return (f'mkdir -p {STATE_DIR} && rm -f "{state}.env" "{state}.cwd" && '
            f"bash --norc --noprofile -c \"$(cat {doc})\"")


def _quote(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"
