"""The state directory keeps its secrets: the token only in its 0600 file, nothing for others.

The server starts on a state directory made the way ``mkdir -p`` makes one (0755), with a
log file the way a shell redirect makes one (0644), as ``make run`` did.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

import dsec
from tests.support.server import ServerProcess

PRIVATE = ("token", "url", "server.log", "node.db", "trajectory.db")
# Below its private top, a subtree may keep the modes its creator chose, where a sandbox
# sees them: the layer store (content-addressed layers every sandbox shares, no secrets),
# the agent binary bind-mounted into every sandbox, each sandbox's own directory (its
# root filesystem's mount point and runc bundle) and runc's state.
OPEN_BELOW = {"images", "bin", "sandboxes", "runc"}


@pytest.fixture
def fresh_server(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    os.chmod(state, 0o755)
    (state / "server.log").touch()
    os.chmod(state / "server.log", 0o644)
    srv = ServerProcess(state_dir=state).start()
    yield srv
    srv.destroy()


def _files(root: Path):
    """Regular files under ``root``, not descending into mounts (layers, sandbox roots)."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not os.path.ismount(os.path.join(dirpath, d))]
        for name in filenames:
            path = Path(dirpath, name)
            if path.is_file() and not path.is_symlink():
                yield path


def _entries(root: Path):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not os.path.ismount(os.path.join(dirpath, d))]
        yield from (Path(dirpath, n) for n in dirnames + filenames)


async def _use(srv: ServerProcess) -> None:
    async with dsec.AsyncClient(srv.url, srv.token) as c:
        sb = await c.create(memory_mb=128, env={"SECRET_ENV": "hunter2"})
        await sb.exec("echo hello", step="s0")
        await sb.files.write("/tmp/x", b"data")
        await sb.stop()
        await c.create(memory_mb=128)  # one left running while the tree is inspected


async def test_the_token_is_only_in_the_token_file(fresh_server):
    srv = fresh_server
    await _use(srv)
    token = srv.token.encode()
    assert token and token not in (srv.state_dir / "server.log").read_bytes()
    holders = [str(p.relative_to(srv.state_dir)) for p in _files(srv.state_dir)
               if token in p.read_bytes()]
    assert holders == ["token"]


async def test_nothing_in_the_state_dir_is_open_to_other_users(fresh_server):
    srv = fresh_server
    await _use(srv)
    assert stat.S_IMODE(srv.state_dir.stat().st_mode) == 0o700  # no other user gets in
    for name in PRIVATE:
        assert stat.S_IMODE((srv.state_dir / name).stat().st_mode) == 0o600, name
    for entry in srv.state_dir.iterdir():  # SQLite's WAL and shared-memory files too
        want = 0o700 if entry.is_dir() else 0o600
        assert stat.S_IMODE(entry.lstat().st_mode) == want, entry.name
    readable = {p.relative_to(srv.state_dir).parts[0] for p in _entries(srv.state_dir)
                if p.lstat().st_mode & 0o044 and not p.is_symlink()}
    assert readable <= OPEN_BELOW
