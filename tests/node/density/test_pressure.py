"""HostSampler on a fake /proc: the host's figures and the sandboxes' own CPU."""

from __future__ import annotations

import time

from dsec.node.density.pressure import HostSampler

MEMINFO = "MemTotal: 24000000 kB\nMemAvailable: 20480000 kB\nSwapTotal: 1048576 kB\n" \
          "SwapFree: 524288 kB\n"


def _proc(tmp_path, busy: int, idle: int):
    (tmp_path / "meminfo").write_text(MEMINFO)
    (tmp_path / "stat").write_text(f"cpu  {busy} 0 0 {idle} 0 0 0 0\ncpu0 0\ncpu1 0\n")
    return tmp_path


def test_sandbox_cpu_is_the_rate_of_their_counter(tmp_path):
    proc = _proc(tmp_path, 100, 100)
    ns = [0]
    s = HostSampler(proc, min_interval_s=0.05, sandbox_cpu_ns=lambda: ns[0])
    first = s.sample()
    assert first.sandbox_cpu_used is None and first.memory_available_mb == 20000
    assert first.swap_free_mb == 512
    time.sleep(0.1)
    _proc(tmp_path, 300, 100)  # the host: both cores busy (the node's own work)
    ns[0] = 10_000_000  # the sandboxes: 10 ms of CPU over at least 0.1 s
    second = s.sample()
    assert second.cpu_used == 2.0
    assert second.sandbox_cpu_used is not None and 0.0 < second.sandbox_cpu_used < 0.2


def test_without_a_counter_there_is_no_sandbox_figure(tmp_path):
    s = HostSampler(_proc(tmp_path, 100, 100), min_interval_s=0.0)
    s.sample()
    assert s.sample().sandbox_cpu_used is None
