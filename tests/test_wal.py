"""Every SQLite file of a server (the gateway's control store, the node's sandbox table and
trajectory log) is checkpointed off the event loop, not inside a commit."""

from __future__ import annotations

import asyncio
import threading
import time

from dsec.api.models import SandboxSpec

from dsec.gateway.projects import Projects
from dsec.gateway.projects.db import open_control_db
from dsec.node.backends.simulated import SimulatedBackend
from dsec.node.config import NodeConfig
from dsec.node.service import NodeService
from dsec.trajectory.log import TrajectoryLog
from dsec.wal import BACKSTOP_PAGES, WAL_KEPT_BYTES, Checkpointer, checkpoint_forever, open_db
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
    monkeypatch.setattr("dsec.wal.CHECKPOINT_S", 0.01)
    monkeypatch.setattr("dsec.wal.DUE_FRAMES", 1)
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


def test_the_trajectory_logs_commits_never_checkpoint_themselves(tmp_path):
    """Each exec commits to the log on the node's loop: a commit that checkpointed would
    hold every request of the node while it fsyncs (0.1-0.16 s seen under 400 execs/s).
    Past SQLite's default of 1,000 pages a commit would have copied the WAL back and
    started it over; here it only grows, until a checkpointer runs."""
    log = TrajectoryLog(tmp_path / "trajectory.db")
    try:
        page = log._pragma("page_size")
        wal = tmp_path / "trajectory.db-wal"
        n = 0
        while n < 300 or wal.stat().st_size <= WAL_KEPT_BYTES * 5 // 4:  # a burst past it
            log.append_many([(f"sb-{n % 7}", None, "exec", "fp", {"cmd": ["true"]},
                              {"stdout": "x" * 8000})])
            n += 1
        assert wal.stat().st_size > 2000 * page
        cp = Checkpointer(tmp_path / "trajectory.db")
        assert cp.run() is True
        cp.close()
        log.append_many([("sb-0", None, "exec", "fp", {}, {})])  # starts the WAL over,
        assert wal.stat().st_size <= WAL_KEPT_BYTES               # cut back to the limit
        assert len(log.entries("sb-3")) == len(range(3, n, 7))  # all there, from the database
    finally:
        log.close()


async def test_a_node_checkpoints_both_its_files_off_the_loop_and_stops_at_close(
        tmp_path, monkeypatch):
    monkeypatch.setattr("dsec.wal.CHECKPOINT_S", 0.01)
    monkeypatch.setattr("dsec.wal.DUE_FRAMES", 1)
    ran: dict[str, asyncio.Event] = {}
    real = Checkpointer.run
    loop = asyncio.get_running_loop()

    def run(self) -> bool:
        out = real(self)
        if out:
            loop.call_soon_threadsafe(ran.setdefault(self.path, asyncio.Event()).set)
        return out

    monkeypatch.setattr(Checkpointer, "run", run)
    node = await NodeService.open(NodeConfig(state_dir=tmp_path, backends=["container"]),
                                  {"container": SimulatedBackend()})
    try:
        for db in (node.store._db, node.trajectory.log._db):
            assert db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == BACKSTOP_PAGES
        sb = await node.create(SandboxSpec())
        await node.stop(sb.id)
        for name in ("node.db", "trajectory.db"):
            async with asyncio.timeout(30):
                while str(tmp_path / name) not in ran:
                    await asyncio.sleep(0.01)
                await ran[str(tmp_path / name)].wait()
    finally:
        await node.close()
    assert node._checkpoints.done()


async def test_a_checkpoint_is_due_only_once_the_wal_holds_enough_frames(tmp_path, monkeypatch):
    """Looked at on a timer, run by the WAL's size: 160 simulated nodes on one machine
    checkpointing every active file twice a second fsynced 640 times a second."""
    monkeypatch.setattr("dsec.wal.CHECKPOINT_S", 0.01)
    monkeypatch.setattr("dsec.wal.DUE_FRAMES", 40)
    db = open_db(tmp_path / "x.db", "CREATE TABLE t (x TEXT);")
    cp = Checkpointer(tmp_path / "x.db")
    runs = 0
    real = cp.run

    def run() -> bool:
        nonlocal runs
        runs += 1
        return real()

    cp.run = run
    task = asyncio.create_task(checkpoint_forever(cp))
    try:
        db.execute("INSERT INTO t VALUES ('a')")
        await asyncio.sleep(0.1)
        assert runs == 0 and 0 < cp.pending() < 40  # a few frames: not worth an fsync
        for _ in range(40):
            db.execute("INSERT INTO t VALUES (?)", ("x" * 5000,))
        async with asyncio.timeout(30):
            while cp.pending():
                await asyncio.sleep(0.01)
        assert runs >= 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        db.close()
    assert cp._closed and Checkpointer(tmp_path / "none.db").pending() == 0


def test_checkpoints_beside_a_steady_stream_of_commits_let_the_wal_start_over(tmp_path):
    """The WAL starts over (and stops growing) only at a commit that finds every frame
    copied back. Commits that land while a checkpoint runs leave it short, so under a
    steady stream one pass per checkpoint left the WAL growing until the backstop
    checkpointed it on the loop and cut 80 MB of it back there (an 800 execs/s load: a
    12-25 ms hold every 6 s, most of the exec p99). The checkpointer catches up instead."""
    path = tmp_path / "trajectory.db"
    log = TrajectoryLog(path)
    cp = Checkpointer(path)
    wal = tmp_path / "trajectory.db-wal"
    stop = threading.Event()

    def checkpoints() -> None:  # as checkpoint_forever, on its worker thread
        while not stop.is_set():
            if cp.pending() >= 200:
                cp.run()
            time.sleep(0.005)

    worker = threading.Thread(target=checkpoints)
    worker.start()
    biggest = 0
    try:
        for i in range(1500):  # about 40 MB of WAL if it never started over
            log.append_many([(f"sb-{i % 7}", None, "exec", "fp", {"cmd": ["true"]},
                              {"stdout": "x" * 2000})])
            biggest = max(biggest, wal.stat().st_size)
            time.sleep(0.002)  # an exec load's group commits come a few ms apart
    finally:
        stop.set()
        worker.join()
        cp.close()
    try:
        assert biggest < 8 << 20, f"the WAL grew to {biggest >> 20} MiB"
        assert len(log.entries("sb-3")) == len(range(3, 1500, 7))
    finally:
        log.close()
