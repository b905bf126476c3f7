"""``dsec demo``: a guided tour of what a sandbox does, for a newcomer to read along.

Each step prints the Python SDK call it makes, then what came back, so the output doubles
as a first tutorial. Every sandbox it creates carries one job id and is stopped at the end,
whatever happens in between.
"""

from __future__ import annotations

import secrets
import time
from typing import Annotated

import typer
from rich.markup import escape
from rich.rule import Rule

import dsec
from dsec.api.errors import DSecError
from dsec.cli.common import cli_errors, out

__all__ = ["demo"]


class _Tour:
    def __init__(self) -> None:
        self.n = 0

    def step(self, title: str, code: str) -> None:
        self.n += 1
        out.print()
        out.print(Rule(f"[bold]{self.n}. {escape(title)}", align="left", style="cyan"),
                  width=min(out.width, 100))
        for line in code.strip().splitlines():
            out.print(f"  [dim]>>>[/] [green]{escape(line)}[/]")

    def say(self, text: str) -> None:
        out.print(f"  {text}", soft_wrap=True)

    def show(self, label: str, value: object) -> None:
        out.print(f"  [bold]{escape(label)}[/] {escape(repr(value))}", soft_wrap=True)


@cli_errors
def demo(
    image: Annotated[str, typer.Option(help="image to start the sandboxes from")] = "busybox",
    count: Annotated[int, typer.Option(min=1, max=16, help="sandboxes to create")] = 3,
    guest: Annotated[bool, typer.Option(
        help="also start a microvm guest (its own kernel; seconds under TCG)")] = True,
) -> None:
    """A guided tour: create sandboxes, use them, stop them, showing each SDK call.

    Commands, a streamed command, a shell session, files, a timeout and an error."""
    job = f"demo-{secrets.token_hex(3)}"
    tour = _Tour()
    with dsec.Client() as client:
        out.print(f"[bold]dsec demo[/]: talking to {client.url} "
                  "(from DSEC_URL, or the local server's state directory)")
        try:
            _run(tour, client, image, count, job)
            if guest:
                _guest(tour, client, image, job)
        finally:
            stopped = client.stop_all(job=job)  # first, so that no print can prevent it
            tour.step("clean up: stop every sandbox of the demo's job",
                      f"client.stop_all(job={job!r})")
            tour.say(f"stopped {stopped} sandboxes; their processes, mounts and files "
                     "are gone")
    out.print()
    out.print("[bold green]done.[/] Next: [bold]dsec create[/], [bold]dsec shell ID[/], "
              "[bold]dsec exec ID -- CMD[/], [bold]dsec cp[/], [bold]dsec rm ID[/].")


def _run(tour: _Tour, client, image: str, count: int, job: str) -> None:
    tour.step(f"create {count} sandboxes in one request",
              f"sbs = client.create_many({count}, image={image!r}, memory_mb=128, "
              f"job={job!r})")
    t0 = time.perf_counter()
    sbs = client.create_many(count, image=image, memory_mb=128, job=job)
    tour.say(f"{len(sbs)} sandboxes running after {time.perf_counter() - t0:.2f}s "
             "(`dsec ls` lists them too):")
    for info in client.list(job=job):
        tour.say(f"  {info.id}  {info.state}  {info.image}  {info.memory_mb} MiB  job={info.job}")
    a, b = sbs[0], sbs[-1]

    tour.step("run a command: each sandbox has its own hostname (its id)",
              "for sb in sbs:\n    sb.exec('hostname').stdout")
    for sb in sbs:
        tour.say(f"{sb.id}: {escape(sb.exec('hostname').stdout.strip())}")

    tour.step("exit code, stdout and stderr come back separately",
              "r = a.exec('echo out; echo err >&2; exit 3')")
    r = a.exec("echo out; echo err >&2; exit 3")
    tour.show("r.exit_code =", r.exit_code)
    tour.show("r.stdout    =", r.stdout)
    tour.show("r.stderr    =", r.stderr)

    tour.step("stream a longer command's output as it is written",
              "for ev in a.exec_stream('for i in 1 2 3; do echo tick $i; sleep 0.3; done'):")
    for ev in a.exec_stream("for i in 1 2 3; do echo tick $i; sleep 0.3; done"):
        if ev.type == "exit":
            tour.say(f"[dim]exit {ev.result.exit_code} after {ev.result.duration_ms:.0f} ms[/]")
        else:
            tour.say(f"{ev.type}: {escape(ev.data.rstrip())}")

    tour.step("a shell session keeps its working directory and exported variables",
              "sh = a.shell()\nsh.run('mkdir -p /workspace && cd /workspace && export GREETING=hello')\n"
              "sh.run('pwd; echo $GREETING')")
    sh = a.shell()
    sh.run("mkdir -p /workspace && cd /workspace && export GREETING=hello")
    tour.show("output:", sh.run("pwd; echo $GREETING").stdout)
    sh.close()

    _files(tour, a, b)
    _fncall(tour, client)
    _failures(tour, client, a)


def _fncall(tour: _Tour, client) -> None:
    if not any(i.name == "python:3.11" for i in client.images()):
        tour.say("[dim](no python:3.11 image on this node: `make base-images` adds it, and "
                 "with it client.fncall)[/]")
        return
    tour.step("a stateless call on a pooled, isolated worker (no sandbox to manage)",
              "client.fncall('print(1 + 1)').stdout")
    t0 = time.perf_counter()
    out = client.fncall("print(1 + 1)")
    tour.show("stdout:", out.stdout)
    tour.say(f"[dim]{(time.perf_counter() - t0) * 1000:.0f} ms, the first call includes "
             "starting the worker pool[/]")


def _guest(tour: _Tour, client, image: str, job: str) -> None:
    tour.step("the same calls on a microvm guest, which runs its own kernel",
              f"vm = client.create(backend='microvm', image={image!r}, memory_mb=256, "
              f"job={job!r})\nvm.exec('uname -r').stdout")
    if not any("microvm" in n.backends for n in client.nodes()):
        tour.say("[dim]skipped: no node of this server offers the microvm backend[/]")
        return
    t0 = time.perf_counter()
    vm = client.create(backend="microvm", image=image, memory_mb=256, job=job)
    tour.say(f"guest {vm.id} answered after {time.perf_counter() - t0:.1f}s (QEMU: KVM where "
             "it works, TCG otherwise; a node's first guest also builds the guest kernel and "
             "initramfs and probes KVM once, so later ones start faster)")
    tour.show("its kernel:", vm.exec("uname -r").stdout.strip())
    tour.say("the same image's files, the same exec, shell and files calls; only "
             "backend= changed")


def _files(tour: _Tour, a, b) -> None:
    tour.step("write and read files; sandboxes do not see each other's files",
              "a.files.write('/tmp/notes.txt', 'hello from the demo\\n')\n"
              "a.files.read('/tmp/notes.txt')\n"
              "b.exec('cat /tmp/notes.txt').exit_code")
    a.files.write("/tmp/notes.txt", "hello from the demo\n")
    tour.show("a reads:", a.files.read("/tmp/notes.txt"))
    tour.show("a lists /tmp:", [f.name for f in a.files.list("/tmp")])
    r = b.exec("cat /tmp/notes.txt")
    tour.show(f"b ({b.id}) gets exit code", r.exit_code)
    tour.show("  with stderr", r.stderr)


def _failures(tour: _Tour, client, a) -> None:
    tour.step("a command that runs too long is killed at its timeout",
              "r = a.exec('sleep 30', timeout=1)")
    r = a.exec("sleep 30", timeout=1)
    tour.show("r.timed_out =", r.timed_out)
    tour.say(f"it was killed after {r.duration_ms / 1000:.1f}s; the sandbox lives on: "
             f"{escape(a.exec('echo still here').stdout.strip())}")

    tour.step("a missing program is exit code 127, not an exception",
              "a.exec('no-such-program').exit_code")
    tour.show("exit code:", a.exec("no-such-program").exit_code)

    tour.step("mistakes raise one kind of exception, dsec.DSecError, with a clear message",
              "client.get('sb-00000000-000000000000')")
    try:
        client.get("sb-00000000-000000000000")
    except DSecError as exc:
        tour.say(f"raised [bold]dsec.{type(exc).__name__}[/]: {escape(exc.message)}")
