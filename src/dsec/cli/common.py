"""What every command shares: consoles, the error boundary, small parsers and formatters."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Annotated, Any, NoReturn, TypeVar

import httpx
import pydantic
import pydantic_core
import typer
from rich.console import Console
from rich.text import Text

from dsec.api.errors import DSecError, Unauthorized
from dsec.sdk.client import _state_dir, default_token, default_url

__all__ = ["out", "err", "fail", "cli_errors", "parse_pairs", "age", "mib", "exit_status",
           "server_needed", "DISTRIBUTION", "JsonOpt", "print_json"]

DISTRIBUTION = "dsec-sandbox"  # the name on PyPI; the import name is dsec

# Piped output keeps whole rows (for grep) instead of folding to 80 columns.
out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, highlight=False, soft_wrap=True)

F = TypeVar("F", bound=Callable)

JsonOpt = Annotated[bool, typer.Option(
    "--json", help="print the result as one JSON document on stdout (for scripts)")]


def print_json(value: Any) -> None:
    """``value`` (wire models, lists and dicts of them) as indented JSON on stdout."""
    sys.stdout.write(json.dumps(pydantic_core.to_jsonable_python(value), indent=2) + "\n")
    sys.stdout.flush()


def fail(message: str, code: int = 1) -> NoReturn:
    """Print ``error: message`` as one red line on stderr and exit with ``code``."""
    err.print(Text("error: " + " ".join(message.split()), style="red"), soft_wrap=True)
    raise typer.Exit(code)


def cli_errors(fn: F) -> F:
    """Turn SDK and connection errors into one red line and exit status 1, never a trace."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Unauthorized as exc:
            fail(f"{exc.message}; {_token_hint()}")
        except DSecError as exc:
            fail(exc.message or type(exc).__name__)
        except pydantic.ValidationError as exc:  # the SDK checks arguments before sending
            fail("; ".join(_validation_message(e) for e in exc.errors()))
        except httpx.TransportError as exc:
            fail(f"cannot reach the dsec server at {default_url()} ({type(exc).__name__}: "
                 f"{exc}); start one with `dsec serve` or set DSEC_URL")
        except KeyboardInterrupt:
            err.print("interrupted")
            raise typer.Exit(130) from None
    return wrapper  # type: ignore[return-value]


def _token_hint() -> str:
    """Where the CLI took its token from (in default_token's order), and what to change."""
    fix = f"set DSEC_TOKEN to a token of the server at {default_url()}"
    if os.environ.get("DSEC_TOKEN"):
        return f"the token came from DSEC_TOKEN: {fix}"
    token_file = _state_dir() / "token"
    if default_token() is not None:
        return f"the token came from {token_file} (DSEC_TOKEN is not set): {fix}"
    return (f"no token: DSEC_TOKEN is not set and {token_file} cannot be read; {fix}, or "
            "DSEC_STATE_DIR to the state directory of a server on this machine")


@contextlib.contextmanager
def server_needed(command: str, extra: str = "server") -> Iterator[None]:
    """Around the imports of the server stack: a client-only install says what to add."""
    try:
        yield
    except ImportError as exc:
        fail(f"`{command}` runs the dsec server, which this install lacks (no module "
             f"{exc.name!r}): pip install '{DISTRIBUTION}[{extra}]'")


def _validation_message(e: dict) -> str:
    msg = str(e.get("msg", "")).removeprefix("Value error, ")
    loc = ".".join(str(x) for x in e.get("loc", ()))
    return msg if loc and msg.startswith(loc) else f"{loc}: {msg}" if loc else msg


def parse_pairs(items: list[str] | None, option: str) -> dict[str, str]:
    """``["k=v", ...]`` (the values of ``option``) into a dict; a malformed item is a
    usage error."""
    pairs: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"takes KEY=VALUE; got {item!r}", param_hint=option)
        pairs[key] = value
    return pairs


def age(ts: float | None, now: float | None = None) -> str:
    """A short human age: ``42s``, ``5m``, ``3h``, ``2d``."""
    if ts is None:
        return "-"
    s = max(0, int((now or time.time()) - ts))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}"
    return f"{s}s"


def mib(n_bytes: int) -> str:
    """Bytes as a short size."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n_bytes >= size:
            return f"{n_bytes / size:.1f} {unit}"
    return f"{n_bytes} B"


def exit_status(code: int) -> int:
    """A command's exit code as a process exit status (unknown codes become 1)."""
    return code if 0 <= code <= 255 else 1
