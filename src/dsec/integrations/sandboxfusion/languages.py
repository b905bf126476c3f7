"""How each SandboxFusion language is compiled and run: a table, and the probe that tells
which of them an image has. Pure data, no I/O.

Commands follow SandboxFusion's runners where a Debian package gives the same tool; where
it does not, the Debian equivalent is named in the recipe (``ts-node --transpile-only``
for ``tsx``, ``mcs``/``mono`` for ``dotnet``, ``ldmd2`` for ``dmd``). Languages with no
Debian toolchain (``julia``, ``swift``, ``lean``, ``python2``, ``react``) and the GPU ones
(``cuda``, ``python_gpu``) have no recipe and answer "not available".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Recipe", "RECIPES", "UNAVAILABLE", "probe_script", "parse_probe", "source_for"]

JUNIT = "/usr/share/java/junit-platform-console-standalone.jar"
_BABEL_TS = "/usr/share/nodejs/@babel/preset-typescript"
_JEST_CONFIG = ('{"transform": {"\\\\.[jt]sx?$": ["babel-jest", {"presets": ["%s"]}]}}'
                % _BABEL_TS)


@dataclass(frozen=True)
class Recipe:
    """``source``: the file the code goes to; ``compile``/``run``: shell commands run in the
    call's directory; ``probe``: a shell test that succeeds when the image can run it;
    ``native``: the dsec fncall language that runs the code directly (no shell driver)."""

    source: str
    run: str
    probe: str
    compile: str | None = None
    native: str | None = None


def _has(*tools: str) -> str:
    return " && ".join(f"command -v {t}" for t in tools)


RECIPES: dict[str, Recipe] = {
    "python": Recipe("main.py", "python3 main.py", _has("python3"), native="python"),
    "pytest": Recipe("main.py", "python3 -m pytest -q -p no:cacheprovider main.py",
                     "python3 -c 'import pytest'"),
    # not main.sh: the shell driver of a non-native call is main.sh itself
    "bash": Recipe("code.sh", "bash code.sh", _has("bash"), native="bash"),
    "c": Recipe("main.c", "./test", _has("gcc"), compile="gcc main.c -o test -lm"),
    "cpp": Recipe("main.cpp", "./test", _has("g++"),
                  compile="g++ -std=c++17 main.cpp -o test -lpthread"),
    "gtest": Recipe("main.cpp", "./test", "ls /usr/lib/*/libgtest_main.a",
                    compile="g++ -std=c++17 main.cpp -o test -lgtest -lgtest_main -lpthread"),
    "go": Recipe("main.go", "./out", _has("go"), compile="go build -o out main.go"),
    "go_test": Recipe("main_test.go", "go test main_test.go", _has("go")),
    "java": Recipe("Main.java", "java -cp . -ea Main", _has("javac", "java"),
                   compile="javac -cp . Main.java"),
    "junit": Recipe("Main.java",
                    f"java -jar {JUNIT} --class-path . --scan-class-path",
                    f"{_has('javac', 'java')} && test -f {JUNIT}",
                    compile=f"javac -cp .:{JUNIT} *.java"),
    "nodejs": Recipe("main.js", "node main.js", _has("node")),
    "typescript": Recipe("main.ts", "ts-node --transpile-only main.ts", _has("ts-node")),
    # SandboxFusion's jest runs TypeScript tests through babel: Debian's preset, inline
    "jest": Recipe("main.test.ts", f"jest --ci --config '{_JEST_CONFIG}' main.test.ts",
                   f"{_has('jest')} && test -d {_BABEL_TS}"),
    "php": Recipe("main.php", "php -f main.php", _has("php")),
    "csharp": Recipe("main.cs", "mono main.exe", _has("mcs", "mono"),
                     compile="mcs -out:main.exe main.cs"),
    "rust": Recipe("main.rs", "./test", _has("rustc"), compile="rustc main.rs -o test"),
    "lua": Recipe("main.lua", "lua5.4 main.lua", _has("lua5.4")),
    "R": Recipe("main.R", "Rscript main.R", _has("Rscript")),
    "perl": Recipe("main.pl", "perl main.pl", _has("perl")),
    "D_ut": Recipe("main.d", "./test", _has("ldmd2"),
                   compile="ldmd2 main.d -unittest -of=test"),
    "ruby": Recipe("main.rb", "ruby main.rb", _has("ruby")),
    "scala": Recipe("main.scala", "scala -cp . {classname}", _has("scalac", "scala"),
                    compile="scalac main.scala"),
    "kotlin_script": Recipe("main.kts", "kotlinc -script main.kts", _has("kotlinc")),
    "verilog": Recipe("main.sv", "vvp -n test.vvp", _has("iverilog", "vvp"),
                      compile="iverilog -Wall -Winfloop -Wno-timescale -g2012 -s tb "
                              "-o test.vvp main.sv"),
    "racket": Recipe("main.rkt", "racket main.rkt", _has("racket")),
    "sql": Recipe("main.sql", "sqlite3 -bail :memory: < main.sql", _has("sqlite3")),
}
UNAVAILABLE: dict[str, str] = {
    "cuda": "needs a GPU, which dsec's fncall workers do not have",
    "python_gpu": "needs a GPU, which dsec's fncall workers do not have",
    "julia": "Debian 12 packages no Julia",
    "swift": "Debian 12 packages no Swift toolchain",
    "lean": "Debian 12 packages no Lean 4 (lake) toolchain",
    "python2": "Debian 12 packages no Python 2",
    "react": "SandboxFusion itself has no runner for it",
}


def probe_script() -> str:
    """A bash script printing, one a line, each language whose probe passes in the image."""
    lines = [f"if {{ {r.probe}; }} >/dev/null 2>&1; then echo {lang}; fi"
             for lang, r in RECIPES.items()]
    return "\n".join(lines) + "\n"


def parse_probe(stdout: str) -> frozenset[str]:
    return frozenset(line for line in stdout.split() if line in RECIPES)


_SCALA_OBJECT = re.compile(r"object\s+(\w+)")
_JAVA_PUBLIC = re.compile(r"public\s+(?:final\s+|abstract\s+)*class\s+(\w+)")
_PHP_OPEN = re.compile(r"^\s*(#!.*\n)?\s*<\?php", re.IGNORECASE)


def source_for(language: str, code: str) -> tuple[str, str, str | None]:
    """The (file name, code, error) for ``code``: SandboxFusion's own adjustments (a PHP
    opening tag added when missing; Scala needs an ``object`` to run; a JUnit class goes
    to the file its public class names)."""
    recipe = RECIPES[language]
    if language == "php" and not _PHP_OPEN.match(code):
        code = "<?php\n" + code
    if language == "scala" and not _SCALA_OBJECT.search(code):
        return recipe.source, code, "Object name not found."
    if language == "junit" and (m := _JAVA_PUBLIC.search(code)):
        return f"{m.group(1)}.java", code, None
    return recipe.source, code, None


def run_command(language: str, code: str) -> str:
    """The run command, with the class name filled in where the language needs it."""
    cmd = RECIPES[language].run
    if "{classname}" in cmd:
        m = _SCALA_OBJECT.search(code)
        cmd = cmd.replace("{classname}", m.group(1) if m else "Main")
    return cmd
