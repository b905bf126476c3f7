"""Projects and their tokens in the control store.

Tokens are random 256-bit secrets shown once; the store keeps only their SHA-256 (a slow
password hash buys nothing for a secret no one can guess, and would cost every request).
A token belongs to its project's id, not its path: a token of a deleted project stays
refused even if a new project of the same path is made.

What every request reads (the caller a token names, the quotas on its way to the root) is
kept in memory while the store's generation (``meta.gen``, raised in the same transaction
as every change of a project and every revocation, by whichever gateway makes it) stays
the same: a request then costs one indexed read of that number, and a revoked token is
refused by every gateway sharing the store from its next request on. Expiry is checked
against the clock on every use.
"""

from __future__ import annotations

import hashlib
import math
import secrets
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass

from dsec.api.errors import Conflict, Forbidden, InvalidArgument, NotFound, Unauthorized
from dsec.api.projects import (ROLES, ProjectInfo, Quota, Role, TokenCreated, TokenInfo, Usage,
                               ancestors, within)
from dsec.gateway.projects.db import write
from dsec.gateway.projects.quota import FIELDS, given, grant_problem

__all__ = ["Principal", "ProjectStore", "ROOT_ID"]

ROOT_ID = "prj-root"
_COLS = "id, path, created_at, sandboxes, cpu, memory_mb, creations_per_s"


@dataclass(frozen=True)
class Principal:
    """Who is calling: a token's id (``root`` for the server's), project and role."""

    who: str
    project: str
    role: Role
    token_hash: bytes | None = None  # None for the root token, which cannot be revoked
    expires_at: float | None = None  # None: never (the root token, a token made so)


def token_hash(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).digest()


def _quota(row) -> Quota:
    return Quota(sandboxes=row[3], cpu=row[4], memory_mb=row[5], creations_per_s=row[6])


def _parent(path: str) -> str:
    return path.rpartition("/")[0]


def _token_info(r) -> TokenInfo:
    return TokenInfo(id=r[0], project=r[1], role=r[2], name=r[3], created_at=r[4],
                     expires_at=r[5], revoked_at=r[6], created_by=r[7])


def _minted_expiry(now: float, ttl_s: float | None, by: Principal | None) -> float | None:
    """When a token asked for ``ttl_s`` (None: never) by ``by`` expires: never later than
    ``by`` does. A longer ``ttl_s`` is refused naming the limit; None takes ``by``'s
    expiry. Pure."""
    asked = None if ttl_s is None else now + ttl_s
    if by is None or by.expires_at is None:
        return asked
    if asked is None:
        return by.expires_at
    if asked > by.expires_at:
        raise InvalidArgument(
            f"ttl_s can be at most {max(0, math.floor(by.expires_at - now))} s: the token "
            f"minting it ({by.who}) expires then, and a token never outlives the one that "
            f"made it; got {ttl_s:g}. Ask for less, or for none (ttl_s=None) to take that "
            "expiry")
    return asked


_CACHED = 10_000  # principals (and quota chains) kept at most; past it, start again


class ProjectStore:
    """Projects, tokens (and, through :class:`~dsec.gateway.projects.ledger.Ledger` on
    the same connection, usage and audit) of one installation."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        with write(conn):
            conn.execute("INSERT OR IGNORE INTO projects (id, path, created_at) "
                         "VALUES (?, '', ?)", (ROOT_ID, time.time()))
        self._gen = -1
        self._principals: dict[bytes, tuple[Principal, float | None]] = {}
        self._quotas: dict[tuple[str, ...], dict[str, Quota]] = {}
        # writes what the ledger keeps in memory (its deferred reservations): called before
        # a project changes and before usage is read, so both see every create admitted
        self.settle: Callable[[], None] = lambda: None

    # ---- what requests read, kept while the generation stands ----
    def _bump(self) -> None:
        """Inside a write transaction that changes a project or revokes a token."""
        self.conn.execute("UPDATE meta SET value = value + 1 WHERE key = 'gen'")

    def _fresh(self) -> None:
        gen = self.conn.execute("SELECT value FROM meta WHERE key = 'gen'").fetchone()[0]
        if gen != self._gen:
            self._principals.clear()
            self._quotas.clear()
            self._gen = gen

    def _keep(self, cache: dict, key, value) -> None:
        if len(cache) >= _CACHED:
            cache.clear()
        cache[key] = value

    # ---- projects ----
    def _row(self, path: str):
        row = self.conn.execute(f"SELECT {_COLS} FROM projects WHERE path = ?",
                                (path,)).fetchone()
        if row is None:
            raise NotFound(f"project {path!r} does not exist")
        return row

    def quota(self, path: str) -> Quota:
        return _quota(self._row(path))

    def created_at(self, path: str) -> float:
        return self._row(path)[2]

    def quotas(self, paths: list[str]) -> dict[str, Quota]:
        """The quota of each of ``paths`` that exists (callers do not change the dict)."""
        self._fresh()
        key = tuple(paths)
        if (got := self._quotas.get(key)) is not None:
            return got
        marks = ",".join("?" * len(paths))
        rows = self.conn.execute(f"SELECT {_COLS} FROM projects WHERE path IN ({marks})",
                                 paths).fetchall()
        got = {r[1]: _quota(r) for r in rows}
        self._keep(self._quotas, key, got)
        return got

    def _children(self, path: str) -> list:
        # direct children only: deeper ones took their quota out of these
        like = f"{path}/%" if path else "%"
        rows = self.conn.execute(f"SELECT {_COLS} FROM projects WHERE path LIKE ? "
                                 "AND path != ''", (like,)).fetchall()
        return [r for r in rows if _parent(r[1]) == path]

    def create(self, path: str, quota: Quota) -> ProjectInfo:
        """A sub-project; its parent must exist and have ``quota`` left to give."""
        self.settle()
        parent = _parent(path)
        with write(self.conn):
            if self.conn.execute("SELECT 1 FROM projects WHERE path = ?", (path,)).fetchone():
                raise Conflict(f"project {path!r} exists already")
            try:
                prow = self._row(parent)
            except NotFound:
                raise NotFound(f"project {parent!r}, the parent of {path!r}, does not exist; "
                               "create it first") from None
            siblings = [_quota(r) for r in self._children(parent)]
            if why := grant_problem(path, parent, _quota(prow), siblings, quota):
                raise InvalidArgument(why)
            pid = f"prj-{secrets.token_hex(6)}"
            self.conn.execute(
                f"INSERT INTO projects ({_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (pid, path, time.time(), quota.sandboxes, quota.cpu, quota.memory_mb,
                 quota.creations_per_s))
            self._bump()
        return self.info(path)

    def set_quota(self, path: str, quota: Quota) -> ProjectInfo:
        """A new quota: within what the parent has left, and no less than the children
        were given (what is held already may exceed it; no more is admitted then)."""
        self.settle()
        if path == "":
            raise InvalidArgument("the root project's quota is the cluster's capacity; "
                                  "set quotas on sub-projects")
        parent = _parent(path)
        with write(self.conn):
            self._row(path)
            siblings = [_quota(r) for r in self._children(parent) if r[1] != path]
            if why := grant_problem(path, parent, self.quota(parent), siblings, quota):
                raise InvalidArgument(why)
            kids = given([_quota(r) for r in self._children(path)])
            for name in FIELDS:
                want, out = getattr(quota, name), getattr(kids, name)
                if want is not None and out is not None and out > want + 1e-9:
                    raise InvalidArgument(f"quota.{name} of {path!r} cannot be {want:g}: its "
                                          f"sub-projects were given {out:g}; lower theirs first")
            self.conn.execute("UPDATE projects SET sandboxes = ?, cpu = ?, memory_mb = ?, "
                              "creations_per_s = ? WHERE path = ?",
                              (quota.sandboxes, quota.cpu, quota.memory_mb,
                               quota.creations_per_s, path))
            self._bump()
        return self.info(path)

    def check_empty(self, path: str) -> None:
        """NotFound if there is no project ``path``, Conflict if it has sub-projects or
        holds sandboxes (being created ones too): what :meth:`delete` refuses."""
        self.settle()
        self._check_empty(path)

    def _check_empty(self, path: str) -> None:
        if path == "":
            raise InvalidArgument("the root project cannot be deleted")
        self._row(path)
        kids = self._children(path)
        if kids:
            names = ", ".join(r[1] for r in kids[:5])
            raise Conflict(f"project {path!r} has sub-projects ({names}); delete them first")
        held = self.conn.execute("SELECT count(*) FROM held WHERE path = ?",
                                 (path,)).fetchone()[0]
        if held:
            what = f"{held} sandbox{'es' if held != 1 else ''}"
            raise Conflict(f"project {path!r} holds {what}; stop them first")

    def delete(self, path: str) -> None:
        """Remove an empty project (see :meth:`check_empty`); its tokens stop working.
        What the nodes keep by its path (job leases, snapshots) its caller checked."""
        self.settle()
        with write(self.conn):
            self._check_empty(path)
            self.conn.execute("DELETE FROM projects WHERE path = ?", (path,))
            self.conn.execute("DELETE FROM usage WHERE path = ?", (path,))
            self._bump()

    def usage(self, path: str) -> Usage:
        self.settle()
        row = self.conn.execute("SELECT sandboxes, cpu, memory_mb FROM usage WHERE path = ?",
                                (path,)).fetchone()
        return Usage(sandboxes=row[0], cpu=round(row[1], 6), memory_mb=row[2]) if row \
            else Usage()

    def info(self, path: str) -> ProjectInfo:
        row = self._row(path)
        return ProjectInfo(id=row[0], path=row[1], created_at=row[2], quota=_quota(row),
                           usage=self.usage(path),
                           given=given([_quota(r) for r in self._children(path)]))

    def list(self, scope: str) -> list[ProjectInfo]:
        """``scope`` and every project below it, parents first."""
        paths = [r[0] for r in self.conn.execute("SELECT path FROM projects ORDER BY path")]
        return [self.info(p) for p in paths if within(p, scope)]

    # ---- tokens ----
    def create_token(self, path: str, role: Role, ttl_s: float | None, name: str = "",
                     by: Principal | None = None) -> TokenCreated:
        """A token of ``path``; made ``by`` a token, it is no higher than that one's role
        and expires no later than it does (see :func:`_minted_expiry`)."""
        pid = self._row(path)[0]
        now = time.time()
        if by is not None and ROLES.index(role) > ROLES.index(by.role):
            raise Forbidden(f"a {by.role} token may not mint an {role} token: a token mints "
                            f"roles up to its own")
        expires_at = _minted_expiry(now, ttl_s, by)
        secret = "dsec_" + secrets.token_urlsafe(32)
        info = TokenCreated(id=f"tok-{secrets.token_hex(6)}", project=path, role=role,
                            name=name, created_at=now, expires_at=expires_at,
                            created_by=by.who if by is not None else None, token=secret)
        with write(self.conn):
            self.conn.execute("INSERT INTO tokens (id, hash, project_id, role, name, "
                              "created_at, expires_at, created_by) "
                              "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                              (info.id, token_hash(secret), pid, role, name, now,
                               info.expires_at, info.created_by))
        return info

    def _token_rows(self, where: str, args: tuple) -> list:
        return self.conn.execute(
            "SELECT t.id, p.path, t.role, t.name, t.created_at, t.expires_at, t.revoked_at, "
            "t.created_by FROM tokens t LEFT JOIN projects p ON p.id = t.project_id "
            f"WHERE {where}",
            args).fetchall()

    def tokens(self, path: str) -> list[TokenInfo]:
        pid = self._row(path)[0]
        return [_token_info(r) for r in self._token_rows("t.project_id = ?", (pid,))]

    def token(self, token: str) -> TokenInfo:
        """A token by its id, or by its secret (never echoed back)."""
        if token.startswith("tok-"):
            rows, name = self._token_rows("t.id = ?", (token,)), token
        else:
            rows, name = self._token_rows("t.hash = ?", (token_hash(token),)), "with that secret"
        if not rows or rows[0][1] is None:
            raise NotFound(f"token {name} not found")
        return _token_info(rows[0])

    def live(self, token_id: str) -> bool:
        """Whether token ``token_id`` works now: not revoked or expired, its project there
        (what a credential handed out to it, E2B's envd access token, asks)."""
        row = self.conn.execute(
            "SELECT p.path, t.expires_at, t.revoked_at FROM tokens t LEFT JOIN projects p "
            "ON p.id = t.project_id WHERE t.id = ?", (token_id,)).fetchone()
        return row is not None and row[0] is not None and row[2] is None and (
            row[1] is None or time.time() < row[1])

    def live_ids(self, paths: list[str], roles: tuple[str, ...]) -> list[str]:
        """The ids of the tokens of ``paths`` with one of ``roles`` that work now."""
        marks, now = ",".join("?" * len(paths)), time.time()
        rows = self.conn.execute(
            "SELECT t.id FROM tokens t JOIN projects p ON p.id = t.project_id WHERE "
            f"p.path IN ({marks}) AND t.role IN ({','.join('?' * len(roles))}) AND "
            "t.revoked_at IS NULL AND (t.expires_at IS NULL OR t.expires_at > ?)",
            (*paths, *roles, now)).fetchall()
        return [r[0] for r in rows]

    def revoke_token(self, token_id: str) -> None:
        with write(self.conn):
            self.conn.execute("UPDATE tokens SET revoked_at = ? WHERE id = ? AND "
                              "revoked_at IS NULL", (time.time(), token_id))
            self._bump()

    def principal(self, digest: bytes) -> Principal:
        """The caller a token's hash names; Unauthorized saying why if it names none."""
        self._fresh()
        hit = self._principals.get(digest)
        if hit is not None and (hit[1] is None or time.time() < hit[1]):
            return hit[0]
        who, expires_at = self._principal_row(digest)
        self._keep(self._principals, digest, (who, expires_at))
        return who

    def _principal_row(self, digest: bytes) -> tuple[Principal, float | None]:
        row = self.conn.execute(
            "SELECT t.id, p.path, t.role, t.expires_at, t.revoked_at FROM tokens t "
            "LEFT JOIN projects p ON p.id = t.project_id WHERE t.hash = ?",
            (digest,)).fetchone()
        if row is None:
            raise Unauthorized("missing or wrong bearer token")
        tid, path, role, expires_at, revoked_at = row
        if revoked_at is not None:
            raise Unauthorized(f"token {tid} was revoked")
        if expires_at is not None and time.time() >= expires_at:
            raise Unauthorized(f"token {tid} expired; ask an admin of its project for a new one")
        if path is None:
            raise Unauthorized(f"token {tid} belongs to a project that was deleted")
        return Principal(who=tid, project=path, role=role, token_hash=digest,
                         expires_at=expires_at), expires_at

    def chain(self, path: str) -> list[str]:
        return ancestors(path)
