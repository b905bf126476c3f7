"""Bounds on what one request may carry, and the string rules every request field obeys.

The defaults follow from the in-sandbox agent: it takes at most 4096 argv and 4096 env
entries in one spawn frame of at most 1 MiB, where every byte outside printable ASCII is
sent as a six-byte ``\\u00XX`` escape. The per-field byte limits below keep an ordinary
request well inside one frame; the node also checks the encoded frame itself before it
sends it, so an exotic request within every field limit still gets a clear refusal.

A node sets its own with ``NodeConfig(limits=RequestLimits(...))`` (lowering them is the
useful direction; the agent's own bounds are hard). The wire models read the limits the
process was configured with (:func:`configure`), so the embedded server checks one set;
the OpenAPI documents the defaults. Every refusal names the limit, as ``limits.<field>``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["RequestLimits", "DEFAULT_LIMITS", "RequestModel", "active", "configure",
           "string_problem", "check_env", "check_argv", "check_cmd", "check_path",
           "check_labels", "check_user", "AGENT_MAX_ARGS", "AGENT_MAX_FRAME", "UID_MAX",
           "MAX_LIFE_S"]

AGENT_MAX_ARGS = 4096     # argv and env entries the agent parses (agent.c MAX_ARGS)
AGENT_MAX_FRAME = 1 << 20  # bytes of one agent frame (agent.c MAX_FRAME)
UID_MAX = (1 << 32) - 2   # (uid_t)-1 means "unchanged" to setresuid: never a real id
# seconds a sandbox may be set to live, stay idle or run a background process: 30 days.
# Longer is a mistake, not a need (None means no limit), and 1e300 reached expires_at.
MAX_LIFE_S = 30 * 86400.0


class RequestLimits(BaseModel):
    """Request size limits a node enforces; every field is refused by name past its limit."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    body_bytes: int = Field(32 << 20, ge=1 << 16,
                            description="bytes of one JSON request body (file and blob "
                                        "uploads stream and have their own limits)")
    labels: int = Field(64, ge=0, description="labels on one sandbox")
    label_key_bytes: int = Field(128, ge=1, description="UTF-8 bytes of one label key")
    label_value_bytes: int = Field(1024, ge=0, description="UTF-8 bytes of one label value")
    env: int = Field(1024, ge=0, le=AGENT_MAX_ARGS - 8,
                     description="entries of one env mapping (a sandbox's or a command's)")
    env_bytes: int = Field(256 << 10, ge=1,
                           description="UTF-8 bytes of one env mapping, keys and values")
    argv: int = Field(AGENT_MAX_ARGS, ge=1, le=AGENT_MAX_ARGS,
                      description="entries of an argv list")
    cmd_bytes: int = Field(256 << 10, ge=1,
                           description="UTF-8 bytes of a command: a shell string, or an "
                                       "argv list summed")
    path_bytes: int = Field(4096, ge=1, description="UTF-8 bytes of a path such as cwd "
                                                    "(Linux PATH_MAX)")


DEFAULT_LIMITS = RequestLimits()
_active = DEFAULT_LIMITS


def active() -> RequestLimits:
    """The limits this process checks requests against."""
    return _active


def configure(limits: RequestLimits) -> None:
    """Make ``limits`` the ones this process checks (the node calls it when it opens)."""
    global _active
    _active = limits


def string_problem(s: str) -> str | None:
    """Why ``s`` cannot be a request string, or None. A NUL ends a C string early (env,
    argv, paths), and a lone UTF-16 surrogate cannot be encoded as UTF-8 to be stored or
    sent back: both are refused where they arrive."""
    if "\0" in s:
        return "must not contain NUL bytes (\\u0000)"
    if s.isascii():  # the common case: no surrogate can be in it
        return None
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = s[exc.start]
        return (f"must be valid Unicode; it holds a lone UTF-16 surrogate "
                f"(\\u{ord(bad):04x}) at index {exc.start}")
    return None


def _where(path: str, key: object) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def _walk(value: object) -> tuple[list, str, str | None] | None:
    """The first bad string in ``value`` (keys too): the keys and indexes leading to it,
    innermost first, why, and the key itself when it is a key. The path is built only for
    the bad string, on the way back up (built for every field, it was a tenth of the SDK's
    CPU per exec)."""
    if isinstance(value, str):
        why = string_problem(value)
        return ([], why, None) if why else None
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(k, str) and (why := string_problem(k)):
                return [], why, k
            if v.__class__ not in _SCALARS and (found := _walk(v)):
                found[0].append(k)
                return found
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            if found := _walk(v):
                found[0].append(i)
                return found
    return None


def _problem(data: dict) -> str | None:
    """What is wrong with a string in the body ``data``, naming the field, or None."""
    if (found := _walk(data)) is None:
        return None
    keys, why, bad_key = found
    path = ""
    for key in reversed(keys):
        path = _where(path, key)
    if bad_key is not None:
        return f"{path or 'body'}: key {bad_key!r} {why}"
    return f"{path or 'value'} {why}"


_SCALARS = frozenset({bool, int, float, type(None)})


class RequestModel(BaseModel):
    """Base of every request model: unknown fields, NaN and infinities, NUL bytes and lone
    surrogates anywhere in the body are refused, naming the field."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _strings(cls, data: object) -> object:
        if isinstance(data, dict) and (found := _problem(data)):
            raise ValueError(found)
        return data


def utf8_len(s: str) -> int:
    return len(s.encode("utf-8", "surrogatepass"))


def check_env(env: dict[str, str], field: str = "env") -> dict[str, str]:
    """An env mapping within ``limits.env`` and ``limits.env_bytes``, with keys usable by
    execve (non-empty, no '=')."""
    lim = active()
    if len(env) > lim.env:
        raise ValueError(f"{field} has {len(env)} entries; at most {lim.env} "
                         f"(limits.env)")
    size = sum(utf8_len(k) + utf8_len(v) for k, v in env.items())
    if size > lim.env_bytes:
        raise ValueError(f"{field} holds {size} bytes; at most {lim.env_bytes} "
                         f"(limits.env_bytes)")
    for k in env:
        if not k or "=" in k:
            raise ValueError(f"{field} keys must be non-empty and contain no '='; got {k!r}")
    return env


def check_argv(argv: list[str], field: str) -> list[str]:
    """An argv list within ``limits.argv`` entries and ``limits.cmd_bytes`` in all."""
    lim = active()
    if len(argv) > lim.argv:
        raise ValueError(f"{field} has {len(argv)} entries; at most {lim.argv} (limits.argv)")
    size = sum(utf8_len(a) for a in argv)
    if size > lim.cmd_bytes:
        raise ValueError(f"{field} holds {size} bytes; at most {lim.cmd_bytes} "
                         f"(limits.cmd_bytes)")
    return argv


def check_cmd(cmd: str, field: str = "cmd") -> str:
    """A shell command within ``limits.cmd_bytes``."""
    lim = active()
    if (size := utf8_len(cmd)) > lim.cmd_bytes:
        raise ValueError(f"{field} holds {size} bytes; at most {lim.cmd_bytes} "
                         f"(limits.cmd_bytes)")
    return cmd


def check_path(path: str, field: str) -> str:
    lim = active()
    if (size := utf8_len(path)) > lim.path_bytes:
        raise ValueError(f"{field} holds {size} bytes; at most {lim.path_bytes} "
                         f"(limits.path_bytes)")
    return path


def check_labels(labels: dict[str, str]) -> dict[str, str]:
    lim = active()
    if len(labels) > lim.labels:
        raise ValueError(f"labels has {len(labels)} entries; at most {lim.labels} "
                         f"(limits.labels)")
    for k, v in labels.items():
        if not 1 <= utf8_len(k) <= lim.label_key_bytes:
            raise ValueError(f"labels key {k[:40]!r} must be 1 to {lim.label_key_bytes} bytes "
                             f"(limits.label_key_bytes)")
        if utf8_len(v) > lim.label_value_bytes:
            raise ValueError(f"labels value of {k!r} holds {utf8_len(v)} bytes; at most "
                             f"{lim.label_value_bytes} (limits.label_value_bytes)")
    return labels


def check_user(user: str) -> str:
    """``name``, ``uid``, ``name:gid`` or ``uid:gid``, ids in 0..UID_MAX."""
    if not user:  # the image's user, as when none is given
        return user
    name, sep, group = user.partition(":")
    if len(user) > 256 or not name or any(c.isspace() for c in user) or ":" in group:
        raise ValueError(f"user must be a name or uid, optionally ':gid'; got {user[:80]!r}")
    if sep and not (group.isascii() and group.isdecimal()):
        raise ValueError(f"user's group must be a numeric gid; got {group[:80]!r}")
    for what, part in (("uid", name), ("gid", group)):
        if part.isascii() and part.isdecimal() and int(part) > UID_MAX:
            raise ValueError(f"user's {what} must be between 0 and {UID_MAX}; got {part}")
    return user
