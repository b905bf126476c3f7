"""Dockerfile heredocs (``RUN <<EOF``, ``COPY <<EOF /path``), lowered for buildah 1.28.

Debian 12's buildah (1.28) predates heredoc support: it reads each body line as an
instruction. dsec rewrites every instruction with heredocs into one buildah has always
understood, with BuildKit's meaning (docs.docker.com, "Here-Documents"):

- ``RUN <<EOF`` alone: the body is the script, run by the stage's shell
  (``RUN ["/bin/sh", "-c", body]``).
- ``RUN cmd <<EOF ...``: the instruction line and its bodies, terminators included, are one
  shell script, so the shell feeds each body to its command (``python3 <<EOF``, ``cat
  <<EOF > f``, ``<<-`` tab stripping, quoted words without expansion: all the shell's own).
- ``COPY``/``ADD <<EOF dest``: each body becomes a file named after its word in a private
  build context (``--build-context dsec-heredocs=DIR``), copied with ``--from`` (flags such
  as ``--chown`` kept). Bodies are copied as written: an unquoted body with ``$`` (BuildKit
  would expand it) is refused, naming the line, rather than copied differently.

Not lowered (refused with the line): a body starting with ``#!`` run as its own program, and
a COPY mixing heredocs with files from the context.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field

from dsec.api.errors import InvalidArgument

__all__ = ["HEREDOC", "CONTEXT", "Lowered", "lower_instruction"]

# <<EOF, <<-EOF, <<"EOF", <<'EOF'; not <<< (a here-string) nor 1<<2 (a shift)
HEREDOC = re.compile(r"(?<![<\d])<<(?!<)(-?)([\"']?)([A-Za-z_][A-Za-z0-9_]*)\2")
CONTEXT = "dsec-heredocs"
DEFAULT_SHELL = ["/bin/sh", "-c"]


@dataclass
class Lowered:
    """Files of the heredoc build context: relative path -> content."""

    files: dict[str, str] = field(default_factory=dict)


def _flags(args: str) -> tuple[list[str], str]:
    """Leading ``--flag`` words of an instruction, and the rest of it."""
    flags, rest = [], args.lstrip()
    while rest.startswith("--"):
        word, _, rest = rest.partition(" ")
        flags.append(word)
        rest = rest.lstrip()
    return flags, rest


def lower_instruction(keyword: str, args: str, bodies: tuple[str, ...], raw_bodies: list[str],
                      shell: list[str], line: int, out: Lowered) -> str:
    """One instruction with heredocs as buildah-1.28 text (one line); heredoc files for
    COPY/ADD go into ``out``. ``raw_bodies``: the body and terminator lines as written."""
    flags, rest = _flags(args)
    marks = list(HEREDOC.finditer(rest))
    if keyword == "RUN":
        if HEREDOC.fullmatch(rest.strip()):  # only a heredoc: its body is the script
            if bodies[0].startswith("#!"):
                raise InvalidArgument(f"line {line}: RUN <<{marks[0].group(3)} with a #! "
                                      f"line is not supported here; name the interpreter "
                                      f"(RUN python3 <<EOF)")
            script = bodies[0] + "\n"
        else:
            script = "\n".join([rest, *raw_bodies]) + "\n"
        return " ".join(["RUN", *flags, json.dumps(shell + [script])])
    words = shlex.split(HEREDOC.sub(lambda m: f"<<{m.group(3)}", rest))
    srcs, dest = words[:-1], words[-1] if words else ""
    if not dest or any(not w.startswith("<<") for w in srcs):
        raise InvalidArgument(f"line {line}: {keyword} mixes heredocs with files or has no "
                              f"destination; write one {keyword} for the heredocs, with a "
                              f"destination last")
    if any(f.startswith("--from") for f in flags):
        raise InvalidArgument(f"line {line}: {keyword} --from with a heredoc copies nothing "
                              f"from the stage; drop one of them")
    names = []
    for m, body in zip(marks, bodies):
        if not m.group(2) and "$" in body:
            raise InvalidArgument(f"line {line}: {keyword} <<{m.group(3)}: dsec copies "
                                  f"heredoc bodies as written; quote the word "
                                  f"(<<'{m.group(3)}') or drop the $")
        name = f"{len(out.files)}/{m.group(3)}"
        out.files[name] = body + "\n"
        names.append(name)
    return " ".join([keyword, *flags, f"--from={CONTEXT}", *names, dest])
