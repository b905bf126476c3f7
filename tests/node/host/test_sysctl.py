"""HostLimits against a fake /proc/sys tree: raises only what is low, puts back only its own."""

from __future__ import annotations

from pathlib import Path

from dsec.node.host.sysctl import HostLimits


def _tree(tmp_path: Path, **values: int) -> Path:
    for key, v in values.items():
        p = tmp_path / key.replace("__", "/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"{v}\n")
    return tmp_path


def _get(root: Path, key: str) -> int:
    return int((root / key.replace(".", "/")).read_text())


def test_raises_low_values_only_and_puts_them_back(tmp_path):
    root = _tree(tmp_path, kernel__pid_max=32768)
    lim = HostLimits({"kernel.pid_max": 4194304, "kernel.threads-max": 100000,
                      "fs.absent": 5}, root)
    (root / "kernel/threads-max").write_text("500000\n")  # a name with a dash
    assert lim.ensure() == {"kernel.pid_max": (32768, 4194304)}
    assert _get(root, "kernel.pid_max") == 4194304
    assert _get(root, "kernel.threads-max") == 500000  # never lowered
    assert lim.release(sandboxes_left=False) == {"kernel.pid_max": 32768}
    assert _get(root, "kernel.pid_max") == 32768


def test_left_raised_while_sandboxes_remain(tmp_path):
    root = _tree(tmp_path, kernel__pid_max=32768)
    lim = HostLimits({"kernel.pid_max": 65536}, root)
    lim.ensure()
    assert lim.release(sandboxes_left=True) == {}
    assert _get(root, "kernel.pid_max") == 65536
    # the next node (a restart) finds it raised already and owns nothing to put back
    again = HostLimits({"kernel.pid_max": 65536}, root)
    assert again.ensure() == {}
    assert again.release(sandboxes_left=False) == {}
    assert _get(root, "kernel.pid_max") == 65536


def test_value_changed_by_someone_else_is_theirs(tmp_path):
    root = _tree(tmp_path, kernel__pid_max=32768)
    lim = HostLimits({"kernel.pid_max": 65536}, root)
    lim.ensure()
    (root / "kernel/pid_max").write_text("100000\n")
    assert lim.release(sandboxes_left=False) == {}
    assert _get(root, "kernel.pid_max") == 100000


def test_shared_by_nodes_in_one_process_put_back_by_the_last(tmp_path):
    root = _tree(tmp_path, kernel__pid_max=32768)
    a = HostLimits({"kernel.pid_max": 65536}, root)
    b = HostLimits({"kernel.pid_max": 65536}, root)
    a.ensure()
    b.ensure()
    assert a.release(sandboxes_left=False) == {}
    assert _get(root, "kernel.pid_max") == 65536  # b still runs
    assert b.release(sandboxes_left=False) == {"kernel.pid_max": 32768}
    assert a.release(sandboxes_left=False) == {}  # a second close is a no-op
