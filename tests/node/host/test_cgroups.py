"""The v1 and v2 cgroup drivers against fake hierarchies (plain files in a temp dir), so
both are exercised whatever this host mounts. The kernel's side (a write that reclaims, a
refusal) is not modelled here; tests/node/test_density.py runs the real thing (and one test
below the real v1 cpu hierarchy, where the host has it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dsec.node.host.cgroups import CgroupV1, CgroupV2, detect

REL = "/dsec/sb-x-1"


def _files(d: Path, files: dict[str, str]) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / name).write_text(text)


@pytest.fixture
def v1(tmp_path) -> CgroupV1:
    root = tmp_path / "cgroup"
    _files(root / "memory" / REL.lstrip("/"), {
        "memory.stat": "cache 100\nrss 7\ntotal_cache 4096\ntotal_rss 8192\n"
                       "total_shmem 1024\ntotal_swap 2048\n"
                       "total_workingset_refault_anon 3\ntotal_workingset_refault_file 4\n",
        "memory.usage_in_bytes": "12288\n", "memory.limit_in_bytes": "268435456\n",
        "memory.memsw.limit_in_bytes": "268435456\n",
        "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
        "cgroup.procs": "11\n12\n"})
    _files(root / "memory" / REL.lstrip("/") / "child", {"cgroup.procs": "13\n"})
    _files(root / "cpu" / REL.lstrip("/"), {"cpu.shares": "1024\n", "cpu.idle": "0\n",
                                            "cpu.cfs_quota_us": "-1\n",
                                            "cpu.cfs_period_us": "100000\n"})
    _files(root / "pids" / REL.lstrip("/"), {"pids.max": "max\n"})
    _files(root / "freezer" / REL.lstrip("/"), {"freezer.state": "THAWED\n"})
    (root / "unified").mkdir()
    return detect(root)


@pytest.fixture
def v2(tmp_path) -> CgroupV2:
    root = tmp_path / "cgroup"
    _files(root, {"cgroup.controllers": "cpu memory pids\n"})
    _files(root / REL.lstrip("/"), {
        "memory.stat": "anon 8192\nfile 4096\nshmem 1024\nworkingset_refault_anon 3\n"
                       "workingset_refault_file 4\n",
        "memory.current": "12288\n", "memory.max": "max\n", "memory.swap.max": "0\n",
        "memory.swap.current": "2048\n", "memory.reclaim": "",
        "memory.pressure": "some avg10=1.50 avg60=0.20 avg300=0.00 total=1\n"
                           "full avg10=0.50 avg60=0.00 avg300=0.00 total=1\n",
        "memory.events": "low 0\nhigh 0\nmax 0\noom 1\noom_kill 1\n",
        "cpu.idle": "0\n", "cpu.max": "max 100000\n", "pids.max": "max\n",
        "cgroup.procs": "21\n", "cgroup.freeze": "0\n",
        "cgroup.events": "populated 1\nfrozen 1\n"})
    return detect(root)


def test_detect_picks_the_driver_from_the_root(v1, v2):
    assert isinstance(v1, CgroupV1) and v1.version == 1
    assert isinstance(v2, CgroupV2) and v2.version == 2


def test_memory_stat_is_the_same_shape_on_both(v1, v2):
    for drv in (v1, v2):
        st = drv.memory_stat(REL)
        assert (st.anon, st.file, st.shmem, st.swap, st.refaults) == (8192, 4096, 1024,
                                                                      2048, 7)
        assert drv.memory_bytes(REL) == 12288


def test_counters_and_members(v1, v2):
    assert v1.oom_kills(REL) == 2 and v2.oom_kills(REL) == 1
    assert sorted(v1.procs(REL)) == [11, 12, 13] and v2.procs(REL) == [21]
    assert v1.exists(REL) and not v1.exists("/dsec/other")


def test_v1_swap_is_memsw_above_memory(v1):
    d = v1.root / "memory" / REL.lstrip("/")
    assert v1.set_swap(REL, 256 << 20, 64 << 20)
    assert int((d / "memory.memsw.limit_in_bytes").read_text()) == 320 << 20
    assert v1.set_swap(REL, 256 << 20, 0)
    assert int((d / "memory.memsw.limit_in_bytes").read_text()) == 256 << 20


def test_v2_swap_is_swap_max(v2):
    assert v2.set_swap(REL, 256 << 20, 64 << 20)
    assert (v2.root / REL.lstrip("/") / "memory.swap.max").read_text() == str(64 << 20)


def test_v2_without_swap_accounting_cannot_allow_swap(v2):
    (v2.root / REL.lstrip("/") / "memory.swap.max").unlink()
    assert v2.set_swap(REL, 1, 0) and not v2.set_swap(REL, 1, 4096)


def test_limits(v1, v2):
    assert v1.memory_limit(REL) == 256 << 20
    assert v2.memory_limit(REL) >= 1 << 62  # "max"
    assert v1.set_memory_limit(REL, 128 << 20)
    assert v1.memory_limit(REL) == 128 << 20
    # v2: memory.max never refuses, so a limit the cgroup is not down to reports False
    assert not v2.set_memory_limit(REL, 4096) and v2.set_memory_limit(REL, 1 << 20)


def test_v2_reclaim_writes_memory_reclaim(v2):
    assert v2.reclaim(REL, 1 << 20)
    assert (v2.root / REL.lstrip("/") / "memory.reclaim").read_text() == str(1 << 20)


def test_v1_has_no_memory_reclaim(v1):
    with pytest.raises(NotImplementedError):
        v1.reclaim(REL, 1)


def test_pressure(v1, v2):
    assert v2.memory_pressure(REL) == 1.5
    assert v1.memory_pressure(REL) is None


def test_cpu_idle_v1_drops_shares_and_sets_idle(v1):
    d = v1.root / "cpu" / REL.lstrip("/")
    v1.set_cpu_idle(REL, True)
    assert (d / "cpu.shares").read_text() == "2" and (d / "cpu.idle").read_text() == "1"
    assert v1.cpu_idle(REL)
    v1.set_cpu_idle(REL, False)
    assert (d / "cpu.shares").read_text() == "1024" and not v1.cpu_idle(REL)


def test_cpu_idle_v1_again_and_back_on_the_real_hierarchy():
    """The kernel refuses cpu.shares while cpu.idle is 1 (a fake file would take it): making
    a best-effort cgroup best-effort again (a guest restored from disk into its cgroup) or
    latency class again works. Before, both raised EINVAL."""
    drv = detect()
    if drv.version != 1 or os.geteuid() != 0 or not (drv.root / "cpu" / "cpu.idle").exists():
        pytest.skip("needs root on a cgroup v1 cpu hierarchy with cpu.idle")
    rel = f"/dsec/test-cpu-idle-{os.getpid()}"
    d = drv.root / "cpu" / rel.lstrip("/")
    d.mkdir(parents=True)
    try:
        drv.set_cpu_idle(rel, True)
        drv.set_cpu_idle(rel, True)
        assert drv.cpu_idle(rel)
        drv.set_cpu_idle(rel, False)
        assert not drv.cpu_idle(rel) and (d / "cpu.shares").read_text().strip() == "1024"
        drv.set_cpu_idle(rel, True)
        assert drv.cpu_idle(rel)
    finally:
        d.rmdir()


def test_cpu_idle_v1_before_5_15_uses_shares_only(v1):
    d = v1.root / "cpu" / REL.lstrip("/")
    (d / "cpu.idle").unlink()
    v1.set_cpu_idle(REL, True)
    assert v1.cpu_idle(REL) and not (d / "cpu.idle").exists()


def test_cpu_idle_v2(v2):
    v2.set_cpu_idle(REL, True)
    assert (v2.root / REL.lstrip("/") / "cpu.idle").read_text() == "1" and v2.cpu_idle(REL)


def test_freeze_v1_and_v2(v1, v2):
    v1.set_frozen(REL, True)  # the fake file reads back what was written: "reached"
    assert (v1.root / "freezer" / REL.lstrip("/") / "freezer.state").read_text() == "FROZEN"
    v2.set_frozen(REL, True)  # cgroup.events already says frozen 1
    assert (v2.root / REL.lstrip("/") / "cgroup.freeze").read_text() == "1"
    with pytest.raises(TimeoutError):
        v2.wait_frozen(lambda: "frozen 1", "frozen 0", timeout=0.01)


def test_set_limits_v1_orders_memsw_and_memory(v1):
    d = v1.root / "memory" / REL.lstrip("/")
    v1.set_limits(REL, 0.5, 512, 100)
    assert int((d / "memory.limit_in_bytes").read_text()) == 512 << 20
    assert int((d / "memory.memsw.limit_in_bytes").read_text()) == 512 << 20
    assert (v1.root / "cpu" / REL.lstrip("/") / "cpu.cfs_quota_us").read_text() == "50000"


def test_set_limits_v2_forbids_swap(v2):
    v2.set_limits(REL, 1.0, 64, 100)
    d = v2.root / REL.lstrip("/")
    assert (d / "memory.max").read_text() == str(64 << 20)
    assert (d / "memory.swap.max").read_text() == "0"
    assert (d / "cpu.max").read_text() == "100000 100000"


def test_leftovers_v1_looks_in_every_hierarchy(v1):
    assert set(v1.leftovers(REL)) == {"memory", "cpu", "pids", "freezer"}
