"""The control store's WAL is checkpointed off the event loop, not inside a commit."""

from __future__ import annotations

import asyncio

from dsec.gateway.projects import Projects
from dsec.gateway.projects.db import BACKSTOP_PAGES, Checkpointer, open_control_db
from dsec.gateway.projects.quota import Ask


def test_a_commit_checkpoints_only_as_a_backstop(tmp_path):
    conn = open_control_db(tmp_path / "projects.db")
    assert conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == BACKSTOP_PAGES
    conn.close()


def test_the_checkpointer_moves_what_was_committed_and_skips_when_nothing_was(tmp_path):
    path = tmp_path / "projects.db"
    projects = Projects("root-token", path)
    cp = Checkpointer(path)
    try:
        for _ in range(20):
            assert projects.ledger.reserve("", {}, Ask(1, 0.5, 64)).problem is None
        assert cp.run() is True
        # every frame of the WAL is in the database now: a second pass has nothing to copy
        busy, frames, done = projects.conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        assert (busy, frames) == (0, done)
        assert cp.run() is False  # nothing committed since
        projects.ledger.reserve("", {}, Ask(1, 0.5, 64))
        assert cp.run() is True
    finally:
        cp.close()
        projects.conn.close()
    assert cp.run() is False  # closed: a late run from the loop does nothing


def test_projects_on_a_file_run_their_checkpointer_and_stop_it(tmp_path, monkeypatch):
    monkeypatch.setattr("dsec.gateway.projects.CHECKPOINT_S", 0.01)
    projects = Projects("root-token", tmp_path / "projects.db")
    ran = asyncio.Event()
    real = projects.checkpointer.run

    def run() -> bool:
        out = real()
        if out:
            loop.call_soon_threadsafe(ran.set)
        return out

    projects.checkpointer.run = run

    class _Gateway:  # reconcile sleeps longer than this test runs
        pass

    async def main() -> None:
        nonlocal loop
        loop = asyncio.get_running_loop()
        projects.start(_Gateway())
        projects.ledger.reserve("", {}, Ask(1, 0.5, 64))
        await asyncio.wait_for(ran.wait(), 30)
        await projects.stop()

    loop = None
    asyncio.run(main())
    assert projects.checkpointer._closed
    assert Projects("root-token").checkpointer is None  # in memory: no WAL to checkpoint
