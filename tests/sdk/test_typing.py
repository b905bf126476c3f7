"""A type checker sees the blocking face as blocking: mypy on user code, over the shipped
``py.typed`` and ``sync.pyi`` (no server; mypy reads the source tree only)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

USER_CODE = '''
import dsec

async def main() -> None:
    async with dsec.AsyncClient() as ac:
        asb = await ac.create()
        reveal_type(asb)
        reveal_type(await asb.exec("true"))

with dsec.Client() as c:
    sb = c.create(image="busybox")
    reveal_type(sb)
    reveal_type(sb.exec("true").exit_code)
    for ev in sb.exec_stream("ls"):
        reveal_type(ev)
    reveal_type(sb.files.read("/x"))
    reveal_type(sb.shell())
    reveal_type(c.create_many(2))
    reveal_type(c.jobs.attach("j"))
    sb.exec(42)
'''

EXPECTED = [
    "dsec.sdk.sandbox.AsyncSandbox",
    "dsec.api.models.ExecResult",
    "dsec.sdk.sync.Sandbox",
    "int",
    "dsec.api.models.ExecEvent",
    "bytes",
    "dsec.sdk.sync.Shell",
    "list[dsec.sdk.sync.Sandbox]",
    "list[dsec.sdk.sync.Sandbox]",
]


def test_mypy_sees_blocking_types(tmp_path):
    (tmp_path / "user.py").write_text(USER_CODE)
    res = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental",
                          "--follow-imports=silent", "--cache-dir", str(tmp_path / "cache"),
                          "user.py"], cwd=tmp_path, capture_output=True, text=True,
                         env={"MYPYPATH": str(SRC), "PATH": "/usr/bin:/bin"}, timeout=300)
    # mypy 2 names builtins without their module ("int"), mypy 1 with it ("builtins.int")
    revealed = [re.sub(r"\bbuiltins\.", "", t)
                for t in re.findall(r'Revealed type is "([^"]+)"', res.stdout)]
    assert revealed == EXPECTED, res.stdout
    # a wrong argument is caught statically, on the blocking face too
    errors = [ln for ln in res.stdout.splitlines() if ": error:" in ln]
    assert len(errors) == 1 and 'incompatible type "int"' in errors[0], res.stdout
