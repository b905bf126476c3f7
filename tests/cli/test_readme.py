"""The README's examples run as they are printed: the Python blocks as scripts, the
SandboxFusion, SWE-ReX and E2B snippets through the real clients, against a real server with
the backends ``make run`` starts them on (container and fncall, busybox and ``python:3.11``);
every ``dsec`` and ``python -m`` command line names commands and options that exist."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import typer

from tests.support.images import ensure_debian_image
from tests.support.server import ServerProcess, leftovers

README = Path(__file__).resolve().parents[2] / "README.md"
# what `make run` serves on, as the README prints it; a test server is elsewhere
DEFAULT_URL, DEFAULT_STATE = "http://127.0.0.1:7070", "/var/lib/dsec/"


def section(text: str, heading: str) -> str:
    """The body of the section under ``heading`` (e.g. ``## Python``), up to the next
    heading of the same or a higher level."""
    level = len(heading) - len(heading.lstrip("#"))
    start = text.index(f"\n{heading}\n")
    end = re.compile(rf"^#{{1,{level}}} ", re.M).search(text, start + len(heading) + 2)
    return text[start:end.start() if end else len(text)]


def blocks(text: str, heading: str, lang: str = "python") -> list[str]:
    """The fenced ``lang`` blocks of one section of ``text``, in order."""
    return re.findall(rf"^```{lang}\n(.*?)^```$", section(text, heading), re.S | re.M)


def python_blocks(text: str, section_heading: str = "## Python") -> list[str]:
    return blocks(text, section_heading)


def for_server(code: str, srv: ServerProcess) -> str:
    """``code`` with the default URL and state dir it prints replaced by ``srv``'s."""
    assert DEFAULT_URL in code or DEFAULT_STATE in code, code
    code = code.replace(DEFAULT_URL, srv.url).replace(DEFAULT_STATE, f"{srv.state_dir}/")
    assert "7070" not in code and DEFAULT_STATE not in code, code
    return code


@pytest.fixture(scope="module")
def readme_server():
    srv = ServerProcess(backends=["container", "fncall"])
    ensure_debian_image(srv.state_dir)  # fncall's workers run python:3.11
    srv.start()
    yield srv
    srv.stop_all_sandboxes()
    srv.stop()  # closes the fncall pools
    left = leftovers(srv.state_dir)
    srv.destroy()
    assert not left, f"the README examples left things behind: {left}"


def run_script(srv: ServerProcess, tmp_path: Path, code: str, *, shell: str = "",
               timeout: float = 300) -> subprocess.CompletedProcess:
    """``code`` as a script, after the ``shell`` lines, in a user's environment: the URL
    and token only."""
    script = tmp_path / "example.py"
    script.write_text(code)
    env = {**srv.env()}
    env.pop("DSEC_STATE_DIR")
    argv = ["bash", "-ec", f'{shell}\nexec "{sys.executable}" {script}'] if shell else \
        [sys.executable, str(script)]
    return subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=timeout)


def test_the_python_section_has_the_two_examples():
    assert len(python_blocks(README.read_text())) >= 2


@pytest.mark.parametrize("index", [0, 1], ids=["async", "blocking"])
def test_readme_python_example_runs_as_a_script(readme_server, tmp_path, index):
    code = python_blocks(README.read_text())[index]
    r = run_script(readme_server, tmp_path, code)
    assert r.returncode == 0, f"README example {index + 1} failed:\n{code}\n{r.stdout}{r.stderr}"
    if index == 1:  # the pty's answer, not only the shell's banner that comes first
        assert "\n42\n" in r.stdout, r.stdout


def test_projects_example_runs(readme_server, tmp_path):
    [code] = blocks(README.read_text(), "### Projects, quotas and tokens")
    r = run_script(readme_server, tmp_path, code)
    assert r.returncode == 0, f"{code}\n{r.stdout}{r.stderr}"


def test_sandboxfusion_example_prints_two(readme_server, tmp_path):
    [code] = blocks(README.read_text(), "### SandboxFusion `run_code`")
    r = run_script(readme_server, tmp_path, for_server(code, readme_server))
    assert (r.returncode, r.stdout) == (0, "2\n\n"), f"{code}\n{r.stdout}{r.stderr}"


def test_swerex_example_keeps_the_session(readme_server, tmp_path):
    [code] = blocks(README.read_text(), "### SWE-ReX")
    r = run_script(readme_server, tmp_path, code)
    assert (r.returncode, r.stdout) == (0, "/tmp\n1\n\n"), f"{code}\n{r.stdout}{r.stderr}"


def test_e2b_example_runs_after_its_exports(readme_server, tmp_path):
    text = README.read_text()
    [exports] = blocks(text, "### E2B SDK", "sh")
    [code] = blocks(text, "### E2B SDK")
    r = run_script(readme_server, tmp_path, code, shell=for_server(exports, readme_server))
    assert (r.returncode, r.stdout) == (0, "1\n\n"), f"{exports}{code}\n{r.stdout}{r.stderr}"


def test_metrics_take_the_token(readme_server):
    url, token = readme_server.url, readme_server.token
    assert httpx.get(f"{url}/metrics").status_code == 401
    r = httpx.get(f"{url}/metrics", headers={"authorization": f"Bearer {token}"})
    assert r.status_code == 200
    assert "# TYPE dsec_gateway_admissions_out_of_order_total" in r.text  # the README names it


def command_lines(text: str) -> list[str]:
    """Every line of the README's ``sh`` blocks, without its comment."""
    out = []
    for block in re.findall(r"^```sh\n(.*?)^```$", text, re.S | re.M):
        out += [re.sub(r"\s#\s.*$", "", ln) for ln in block.splitlines()]
    return out


def dsec_invocations(text: str) -> list[list[str]]:
    """``dsec ...`` commands of the sh blocks, as words (several may share a line)."""
    found = []
    for line in command_lines(text):
        for part in re.split(r"(?:^|\s)dsec (?=[a-z-])", line)[1:]:
            found.append(part.split())
    return found


def _options(cmd) -> set[str]:
    return {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}


def test_every_dsec_command_line_of_the_readme_exists():
    from dsec.cli.main import app
    root = typer.main.get_command(app)
    calls = dsec_invocations(README.read_text())
    assert len(calls) > 30, calls
    for words in calls:
        cmd, path = root, ["dsec"]
        for word in words:
            if word == "--":
                break  # what follows is the sandbox's command
            flag = re.match(r"\[?(--[a-z][a-z-]*)", word)
            if flag:
                assert flag[1] in _options(cmd), f"{' '.join(path)} has no {flag[1]}: {words}"
            elif hasattr(cmd, "commands"):  # a group
                assert word in cmd.commands, f"{' '.join(path)} has no command {word!r}"
                cmd, path = cmd.commands[word], [*path, word]


def test_every_python_module_command_of_the_readme_takes_its_options():
    lines = [ln for ln in command_lines(README.read_text()) if "python -m " in ln]
    assert len(lines) >= 2, lines
    for line in lines:
        module, *args = line.split("python -m ", 1)[1].split()
        r = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, f"{module}: {r.stderr}"
        for flag in re.findall(r"(?:^|\s)(--[a-z][a-z-]*)", " ".join(args)):
            assert re.search(rf"{flag}\b", r.stdout), f"python -m {module} has no {flag}"
