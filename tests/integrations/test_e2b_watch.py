"""The unmodified e2b SDK's files.watch_dir against a real dsec server: the sync SDK's
watcher (CreateWatcher / GetWatcherEvents / RemoveWatcher) and the async SDK's WatchDir
stream, on busybox containers."""

from __future__ import annotations

import asyncio

import pytest
from e2b import (AsyncSandbox, FilesystemEventType, NotFoundException, Sandbox,
                 SandboxException)


@pytest.fixture
def sbx(e2b_env):
    sb = Sandbox.create(template="busybox", timeout=300)
    sb.files.make_dir("/tmp/w")
    yield sb
    sb.kill()


def _names(events) -> set:
    return {(e.name, e.type) for e in events}


def test_watcher_reports_what_changed_since_the_last_call(sbx):
    sbx.files.write("/tmp/w/old", "1")
    w = sbx.files.watch_dir("/tmp/w")
    sbx.files.write("/tmp/w/new", "x")
    sbx.files.remove("/tmp/w/old")
    assert _names(w.get_new_events()) == {("new", FilesystemEventType.CREATE),
                                          ("old", FilesystemEventType.REMOVE)}
    assert w.get_new_events() == []
    sbx.commands.run("echo more >> /tmp/w/new; chmod 600 /tmp/w/new")
    assert _names(w.get_new_events()) == {("new", FilesystemEventType.WRITE),
                                          ("new", FilesystemEventType.CHMOD)}
    w.stop()


def test_a_recursive_watcher_names_entries_below(sbx):
    w = sbx.files.watch_dir("/tmp/w", recursive=True)
    sbx.files.write("/tmp/w/sub/f", "x")  # the write makes sub too
    assert _names(w.get_new_events()) == {("sub", FilesystemEventType.CREATE),
                                          ("sub/f", FilesystemEventType.CREATE)}
    w.stop()


def test_a_watcher_is_served_from_another_client(sbx):
    w = sbx.files.watch_dir("/tmp/w")
    sbx.files.write("/tmp/w/a", "x")
    other = Sandbox.connect(sbx.sandbox_id)
    # the same watcher id through a second SDK instance (another connection, no state)
    from e2b.sandbox_sync.filesystem.watch_handle import WatchHandle
    again = WatchHandle(other.files._rpc, w._watcher_id, other.files._connection_config,
                        other.files._envd_version)
    assert _names(again.get_new_events()) == {("a", FilesystemEventType.CREATE)}
    w.stop()
    with pytest.raises(NotFoundException):
        again.get_new_events()


def test_watching_what_is_no_directory_is_refused(sbx):
    with pytest.raises(NotFoundException):
        sbx.files.watch_dir("/tmp/nowhere")
    sbx.files.write("/tmp/w/file", "x")
    with pytest.raises(SandboxException) as exc:
        sbx.files.watch_dir("/tmp/w/file")
    assert "not a directory" in str(exc.value)


def test_async_watch_dir_streams_events(e2b_env):
    async def main() -> None:
        sb = await AsyncSandbox.create(template="busybox", timeout=300)
        try:
            await sb.files.make_dir("/tmp/aw")
            seen, arrived = [], asyncio.Event()

            def on_event(ev) -> None:
                seen.append((ev.name, ev.type))
                if ("b", FilesystemEventType.CREATE) in seen:
                    arrived.set()

            handle = await sb.files.watch_dir("/tmp/aw", on_event=on_event, timeout=0)
            await sb.files.write("/tmp/aw/b", "x")
            await asyncio.wait_for(arrived.wait(), 60)
            await handle.stop()
            assert seen[0] == ("b", FilesystemEventType.CREATE)
        finally:
            await sb.kill()

    asyncio.run(main())
