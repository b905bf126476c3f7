"""Resource bounds: what a sandbox writes or prints is charged to it, not to the node.

The memory assertions read the server's peak RSS (``VmHWM``, reset through ``clear_refs``)
around one call: a bound relative to the payload, not a timing.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

import dsec
from dsec.node.agent.client import MAX_FRAME
from dsec.node.execution import OutputCap, stdin_frames

MiB = 1 << 20


def _rss(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) << 10
    raise LookupError(field)


class PeakRSS:
    """The growth of a process's peak RSS over a block, in bytes."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.growth = 0

    def __enter__(self) -> PeakRSS:
        Path(f"/proc/{self.pid}/clear_refs").write_text("5")  # peak := current
        self.before = _rss(self.pid, "VmRSS")
        return self

    def __exit__(self, *exc: object) -> None:
        self.growth = _rss(self.pid, "VmHWM") - self.before


@pytest.fixture
async def small(client):
    sb = await client.create(memory_mb=64, disk_mb=1024)
    yield sb
    await sb.stop()


async def test_disk_mb_over_the_node_bound_is_refused(client):
    with pytest.raises(dsec.InvalidArgument, match="max_disk_mb"):
        await client.create(disk_mb=1 << 20)


async def test_files_write_is_charged_to_the_sandbox(client):
    sb = await client.create(memory_mb=128)
    try:
        base = (await sb.refresh()).memory_used_mb
        await sb.files.write("/big", b"x" * (48 * MiB))
        # Uncharged, the sandbox's usage would not move. Charged, it rose 41.7-48 MiB: in a
        # cgroup2 guest of a CI run part of what the base held was given back meanwhile.
        assert (await sb.refresh()).memory_used_mb >= base + 32
    finally:
        await sb.stop()


async def test_files_write_past_memory_mb_is_refused_and_given_back(small):
    with pytest.raises(dsec.InvalidArgument, match="memory_mb=64"):
        await small.files.write("/big", b"x" * (128 * MiB))
    assert (await small.exec("echo ok")).stdout == "ok\n"
    assert (await small.refresh()).memory_used_mb < 32
    await small.files.write("/small", b"y" * MiB)  # the sandbox goes on
    assert (await small.exec("wc -c < /small")).stdout.strip() == str(MiB)


async def test_large_upload_into_a_small_disk_is_refused(server, client, tmp_path):
    sb = await client.create(memory_mb=256, disk_mb=16)
    big = tmp_path / "big"
    with open(big, "wb") as f:
        f.truncate(1 << 30)  # sparse: the client reads zeros without the disk
    try:
        with PeakRSS(server.proc.pid) as peak:
            with pytest.raises(dsec.InvalidArgument, match="disk_mb=16"):
                await sb.files.upload(big, "/big")
        assert peak.growth < 128 * MiB
        assert (await sb.exec("echo ok")).stdout == "ok\n"
        await sb.files.write("/after", b"z")
        assert (await sb.files.read("/after")) == b"z"
    finally:
        await sb.stop()


async def test_large_output_exec_keeps_the_server_bounded(server, sandbox):
    out = 100_000_000
    with PeakRSS(server.proc.pid) as peak:
        r = await sandbox.exec(f"head -c {out} /dev/zero | tr '\\0' a", max_output=1 << 30,
                               timeout=120)
    assert peak.growth < out * 3 // 4, f"server peak RSS grew {peak.growth / MiB:.0f} MiB"
    assert r.exit_code == 0 and r.stdout_truncated and set(r.stdout[:100]) == {"a"}
    assert len(r.stdout) < out


async def test_streamed_exec_is_not_buffered(server, sandbox):
    out, seen = 100_000_000, 0
    with PeakRSS(server.proc.pid) as peak:
        async for ev in sandbox.exec_stream(f"head -c {out} /dev/zero | tr '\\0' a",
                                            max_output=1 << 30, timeout=120):
            if ev.type == "stdout":
                seen += len(ev.data)
    assert seen == out
    assert peak.growth < out // 4, f"server peak RSS grew {peak.growth / MiB:.0f} MiB"


async def test_exec_stdin_into_a_small_disk_ends_with_a_result(client):
    sb = await client.create(memory_mb=256, disk_mb=16)
    try:
        r = await sb.exec("cat > /f", stdin=b"\0" * (20 * MiB), timeout=60)
        assert r.exit_code != 0 and "No space left" in r.stderr
        assert (await sb.exec("echo ok")).stdout == "ok\n"
    finally:
        await sb.stop()


def test_stdin_is_decoded_a_frame_at_a_time():
    data = os.urandom(3 * MAX_FRAME + 5)
    frames = list(stdin_frames(base64.b64encode(data).decode()))
    assert b"".join(frames) == data
    assert len(frames) == 4 and max(map(len, frames)) <= MAX_FRAME


def test_stdin_with_line_breaks_still_decodes():
    data = os.urandom(1000)
    assert b"".join(stdin_frames(base64.encodebytes(data).decode())) == data


def test_malformed_stdin_is_refused_before_anything_runs():
    with pytest.raises(dsec.InvalidArgument, match="stdin must be base64"):
        stdin_frames("abc")


def test_output_cap_keeps_one_buffer_and_passes_up_to_the_limit():
    cap = OutputCap(limit=10, keep=4)
    assert cap.feed(b"h\xc3") == b"h\xc3" and cap.feed(b"\xa9llo wor") == b"\xa9llo wor"
    assert cap.feed(b"ld") == b"" and cap.truncated and cap.passed == 10
    assert cap.text() == "h\u00e9l"
