"""From a call request to the steps a worker runs: pure, no I/O.

A step is one program run in the call's scratch directory as the call's user, under the
call's limits. Compiled languages have two steps (compile, run); the run step is skipped when
the compile step fails. Only the last step gets stdin.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dsec.api.fncall import FnCallRequest

__all__ = ["Step", "Plan", "plan_call", "SHELL_ONLY_LANGUAGES"]

SOURCE = {"python": "main.py", "bash": "main.sh", "sh": "main.sh", "c": "main.c",
          "cpp": "main.cpp"}
COMPILERS = {"c": ["gcc", "-O2", "-std=gnu17", "-o", "main", "main.c", "-lm"],
             "cpp": ["g++", "-O2", "-std=gnu++17", "-o", "main", "main.cpp", "-lm"]}
# what an image without Python can run: the worker starts programs through the agent
SHELL_ONLY_LANGUAGES = ("sh", "bash", "c", "cpp")


@dataclass
class Step:
    """One program. ``kind`` is ``argv`` (exec it), ``python`` (source run in a fork of the
    warm interpreter) or ``callable`` (a pickled function run in a fork)."""

    kind: str
    argv: list[str] = field(default_factory=list)
    source: str = ""
    payload: bytes = b""
    stage: str = "run"


@dataclass
class Plan:
    steps: list[Step]
    files: dict[str, bytes]


def plan_call(req: FnCallRequest) -> Plan:
    """The steps and input files for ``req`` (its code is written to ``main.<ext>``)."""
    files = dict(req.files)
    if req.callable is not None:
        return Plan([Step("callable", payload=req.callable)], files)
    code = req.code or ""
    lang = req.language
    if lang == "python":
        return Plan([Step("python", argv=["main.py", *req.argv], source=code)], files)
    files[SOURCE[lang]] = code.encode()
    if lang in ("bash", "sh"):
        return Plan([Step("argv", argv=[lang, SOURCE[lang], *req.argv])], files)
    compile_argv = [*COMPILERS[lang], *req.compile_args]
    return Plan([Step("argv", argv=compile_argv, stage="compile"),
                 Step("argv", argv=["./main", *req.argv])], files)
