"""The swap manager against a fake /sys, /proc/swaps and /dev (pure: the commands that
would set swap up are recorded and modelled)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsec.node.density.config import SwapConfig
from dsec.node.density.swap import LABEL, SwapManager, _LABEL_AT

HEADER = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"


class Host:
    """A fake host: zram-control, block devices, /proc/swaps, and mkswap/swapon/swapoff."""

    def __init__(self, root: Path, zram: bool = True) -> None:
        self.sys, self.dev, self.swaps = root / "sys", root / "dev", root / "swaps"
        self.run_dir = root / "run"
        self.dev.mkdir(parents=True)
        self.swaps.write_text(HEADER)
        self.calls: list[tuple[str, ...]] = []
        self.next = 1
        if zram:
            (self.sys / "class" / "zram-control").mkdir(parents=True)
            (self.sys / "class" / "zram-control" / "hot_remove").write_text("")
            self._hot_add()

    def _hot_add(self) -> None:
        (self.sys / "class" / "zram-control" / "hot_add").write_text(f"{self.next}\n")
        blk = self.sys / "block" / f"zram{self.next}"
        blk.mkdir(parents=True)
        for f in ("disksize", "comp_algorithm", "reset"):
            (blk / f).write_text("0")

    def run(self, *argv: str) -> None:
        self.calls.append(argv)
        if argv[0] == "mkswap":
            with open(argv[-1], "r+b" if Path(argv[-1]).exists() else "wb") as f:
                f.seek(_LABEL_AT)
                f.write(argv[2].encode() + b"\0" * 16)
            if "zram" in argv[-1]:
                self.next += 1
                self._hot_add()
        elif argv[0] == "swapon":
            size = 1 << 20 if "zram" in argv[-1] else 4 << 10
            self.swaps.write_text(self.swaps.read_text() +
                                  f"{argv[-1]}\tpartition\t{size}\t0\t{argv[2]}\n")
        elif argv[0] == "swapoff":
            lines = self.swaps.read_text().splitlines(keepends=True)
            self.swaps.write_text("".join(ln for ln in lines if not ln.startswith(argv[-1])))

    def manager(self, **cfg) -> SwapManager:
        return SwapManager(SwapConfig(**cfg), sys=self.sys, proc_swaps=self.swaps,
                           run=self.run, dev=self.dev, run_dir=self.run_dir)


def test_adds_a_labelled_zram_device_and_removes_it(tmp_path):
    host = Host(tmp_path)
    m = host.manager(zram_mb=1024)
    st = m.ensure(8 << 30)
    dev = str(host.dev / "zram1")
    assert st.ours == (dev,) and st.total == 1 << 30
    assert (host.sys / "block" / "zram1" / "disksize").read_text() == str(1 << 30)
    assert ("mkswap", "-L", LABEL, dev) in host.calls
    m.release(keep=False)
    assert ("swapoff", dev) in host.calls
    assert (host.sys / "class" / "zram-control" / "hot_remove").read_text() == "1"
    assert m.status().total == 0


def test_default_size_is_half_the_ram(tmp_path):
    host = Host(tmp_path)
    host.manager().ensure(8 << 30)
    assert (host.sys / "block" / "zram1" / "disksize").read_text() == str(4 << 30)


def test_swap_already_there_is_enough(tmp_path):
    host = Host(tmp_path)
    host.swaps.write_text(HEADER + "/swapfile\tfile\t8388608\t0\t-2\n")  # 8 GiB
    m = host.manager(zram_mb=1024)
    st = m.ensure(8 << 30)
    assert st.ours == () and not host.calls
    m.release(keep=False)
    assert not host.calls  # never removes what it did not set up


def test_a_dsec_area_left_by_an_earlier_node_is_used_then_removed_by_the_last_user(tmp_path):
    host = Host(tmp_path)
    first = host.manager(zram_mb=1024)
    first.ensure(8 << 30)
    first.release(keep=True)  # sandboxes remain: the swap stays
    assert ("swapoff", str(host.dev / "zram1")) not in host.calls
    import dsec.node.density.swap as swap_mod
    swap_mod._SHARED.clear()  # as if a new process (a node started again on its state dir)
    host.calls.clear()
    second = host.manager(zram_mb=1024)
    st = second.ensure(8 << 30)
    assert st.ours == (str(host.dev / "zram1"),) and not host.calls  # used, none added
    second.release(keep=False)  # its sandboxes are gone and nobody else uses it
    assert ("swapoff", str(host.dev / "zram1")) in host.calls
    assert (host.sys / "class" / "zram-control" / "hot_remove").read_text() == "1"
    assert not list(host.run_dir.iterdir())  # its lock file went with it


def test_an_area_another_live_node_uses_is_left_until_that_one_closes(tmp_path):
    import fcntl
    import os

    host = Host(tmp_path)
    first = host.manager(zram_mb=1024)
    first.ensure(8 << 30)
    first.release(keep=True)
    import dsec.node.density.swap as swap_mod
    swap_mod._SHARED.clear()
    second = host.manager(zram_mb=1024)
    second.ensure(8 << 30)
    # a node of another process using it: its shared lock, which dies with that process
    other = os.open(second._lock_file(str(host.dev / "zram1")), os.O_RDWR)
    fcntl.flock(other, fcntl.LOCK_SH)
    second.release(keep=False)
    assert ("swapoff", str(host.dev / "zram1")) not in host.calls
    os.close(other)  # that process ends (or is killed): its lock goes with it
    third = host.manager(zram_mb=1024)
    third.ensure(8 << 30)
    third.release(keep=False)
    assert ("swapoff", str(host.dev / "zram1")) in host.calls


def test_nodes_of_one_process_share_it_and_the_last_removes_it(tmp_path):
    host = Host(tmp_path)
    a, b = host.manager(zram_mb=1024), host.manager(zram_mb=1024)
    a.ensure(8 << 30)
    b.ensure(8 << 30)
    assert sum(c[0] == "swapon" for c in host.calls) == 1
    a.release(keep=False)
    assert not any(c[0] == "swapoff" for c in host.calls)
    b.release(keep=False)
    assert any(c[0] == "swapoff" for c in host.calls)


def test_no_zram_module_is_said_and_nothing_breaks(tmp_path):
    host = Host(tmp_path, zram=False)
    m = host.manager(zram_mb=1024)
    st = m.ensure(8 << 30)
    assert st.total == 0 and "no zram" in st.note


def test_optional_swap_file(tmp_path):
    host = Host(tmp_path)
    f = tmp_path / "var" / "swap"
    m = host.manager(zram_mb=0, file=f, file_mb=4)
    st = m.ensure(8 << 30)
    assert st.ours == (str(f),) and f.stat().st_size == 4 << 20 and f.stat().st_mode & 0o777 == 0o600
    m.release(keep=False)
    assert not f.exists()


@pytest.fixture(autouse=True)
def _fresh_process():
    import dsec.node.density.swap as swap_mod
    swap_mod._SHARED.clear()
    yield
    swap_mod._SHARED.clear()


def test_a_smaller_dsec_zram_found_gets_a_second_device_for_the_rest(tmp_path):
    host = Host(tmp_path)
    first = host.manager(zram_mb=1024)
    first.ensure(8 << 30)
    first.release(keep=True)
    import dsec.node.density.swap as swap_mod
    swap_mod._SHARED.clear()  # as if a new process
    host.calls.clear()
    second = host.manager(zram_mb=4096)
    st = second.ensure(8 << 30)
    assert (host.sys / "block" / "zram2" / "disksize").read_text() == str(3 << 30)
    assert set(st.ours) == {str(host.dev / "zram1"), str(host.dev / "zram2")}
    second.release(keep=False)
    assert ("swapoff", str(host.dev / "zram2")) in host.calls  # the one it made
    assert ("swapoff", str(host.dev / "zram1")) in host.calls  # and the one it found, unused now
