"""HostSampler on a fake /proc: the host's figures and the sandboxes' own CPU."""

from __future__ import annotations

import time

from dsec.node.density.pressure import HostSampler, swap_gain

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


SWAPS = ("Filename\tType\tSize\tUsed\tPriority\n"
         "/dev/zram0                              partition\t1048576\t262144\t100\n"
         "/var/swapfile                           file\t524288\t0\t-2\n")


def test_zram_free_space_counts_at_what_compression_saves():
    # 768 MiB of zram free; it holds 256 MiB in 64 MiB of RAM: 3/4 saved -> 576 MiB, plus
    # the swap file's 512 MiB free, whole
    stat = {"zram0": f"{256 << 20} {60 << 20} {64 << 20} 0 {64 << 20} 0 0 0"}
    assert swap_gain(SWAPS, stat.get) == (576 + 512) << 20


def test_an_empty_or_incompressible_zram_gives_nothing():
    assert swap_gain(SWAPS, {"zram0": "0 0 0 0 0 0 0 0"}.get) == 512 << 20
    full = {"zram0": f"{256 << 20} {256 << 20} {260 << 20} 0 0 0 0 0"}
    assert swap_gain(SWAPS, full.get) == 512 << 20
    assert swap_gain("Filename\tType\tSize\tUsed\tPriority\n", full.get) == 0


def test_the_sampler_reports_the_gain_from_proc_swaps_and_sys(tmp_path):
    (tmp_path / "proc").mkdir()
    proc = _proc(tmp_path / "proc", 1, 1)
    (proc / "swaps").write_text(SWAPS)
    (tmp_path / "sys/block/zram0").mkdir(parents=True)
    (tmp_path / "sys/block/zram0/mm_stat").write_text(f"{256 << 20} 1 {64 << 20} 0 0 0 0 0\n")
    figures = HostSampler(proc, sys=tmp_path / "sys").sample()
    assert figures.swap_gain_mb == 576 + 512 and figures.swap_free_mb == 512


def test_recent_keeps_a_sample_for_its_age_and_then_takes_a_new_one(tmp_path):
    proc = _proc(tmp_path, 100, 100)
    s = HostSampler(proc, min_interval_s=0.0)
    first = s.recent(0.2)
    (proc / "meminfo").write_text(MEMINFO.replace("20480000", "10240000"))
    assert s.recent(0.2) is first  # young: the same figures, no read
    time.sleep(0.25)
    assert s.recent(0.2).memory_available_mb == 10000


def test_every_node_of_a_process_shares_one_host_sampler():
    from dsec.node.density.config import DensityConfig
    from dsec.node.density.node import NodeDensity

    a = NodeDensity(DensityConfig(), lambda rec: None)
    b = NodeDensity(DensityConfig(), lambda rec: None)
    assert a.sampler is b.sampler
    assert a.host() is b.host()  # one sample serves both within its quarter second


def test_an_unreadable_file_reads_as_empty(tmp_path):
    s = HostSampler(tmp_path, min_interval_s=0.0)  # no meminfo, stat, pressure at all
    figures = s.sample()
    assert figures.memory_available_mb == 0 and figures.cpu_used is None
