"""The sandbox's mount list and masks (oci.py), against fake host trees: superblocks are
kernel memory per memory cgroup, so hiding and /dev/shm reuse mounts that exist already."""

import json

import pytest

from dsec.node.host import mounts, oci


@pytest.fixture
def profile(tmp_path):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"defaultAction": "SCMP_ACT_ERRNO", "syscalls": []}))
    return path


def _cfg(**kw) -> oci.ContainerConfig:
    return oci.ContainerConfig(hostname="h", rootfs="/r", args=["/a"], env=[],
                               cgroups_path="c", cpu=1, memory_mb=64, pids=64, **kw)


def test_mask_plan_drops_only_empty_procfs_dirs_and_binds_existing_sys_dirs(tmp_path):
    (tmp_path / "proc/acpi").mkdir(parents=True)            # empty: nothing to hide
    (tmp_path / "proc/asound").mkdir()
    (tmp_path / "proc/asound/cards").write_text("")
    (tmp_path / "sys/firmware").mkdir(parents=True)
    (tmp_path / "sys/kernel/debug").mkdir(parents=True)     # empty, hidden anyway (free)
    masked, hidden = oci.mask_plan(tmp_path)
    # absent ones stay runc's: the node's /proc or /sys may show less than a fresh one
    assert masked == ["/proc/asound", "/proc/scsi", "/sys/devices/virtual/powercap"]
    assert hidden == ["/sys/firmware", "/sys/kernel/debug"]


def test_mask_plan_keeps_an_empty_dir_that_is_a_mask_in_the_nodes_view(tmp_path):
    acpi = tmp_path / "proc/acpi"
    acpi.mkdir(parents=True)  # e.g. the node itself in a container that masked it
    mounts.mount("tmpfs", acpi, "tmpfs", mounts.MS_RDONLY)
    try:
        assert "/proc/acpi" in oci.mask_plan(tmp_path)[0]
    finally:
        mounts.umount(acpi)


def test_lean_spec_binds_shm_and_an_empty_dir_instead_of_a_tmpfs_each(profile):
    cfg = _cfg(shm_dir="/s/rw/shm", empty_dir="/s/empty", masked_dirs=["/proc/asound"],
               hidden_dirs=["/sys/firmware", "/sys/kernel/debug"])
    spec = oci.build_config(cfg, seccomp_profile=profile)
    by_dest = {m["destination"]: m for m in spec["mounts"]}
    assert [m["type"] for m in spec["mounts"]].count("tmpfs") == 1  # /dev only
    shm = by_dest["/dev/shm"]
    assert (shm["type"], shm["source"]) == ("bind", "/s/rw/shm")
    assert {"nosuid", "nodev", "noexec"} <= set(shm["options"])
    dests = [m["destination"] for m in spec["mounts"]]
    for d in ("/sys/firmware", "/sys/kernel/debug"):
        assert (by_dest[d]["source"], by_dest[d]["type"]) == ("/s/empty", "bind")
        assert "ro" in by_dest[d]["options"]
        assert dests.index(d) > dests.index("/sys")  # lands on the sandbox's sysfs
    masked = spec["linux"]["maskedPaths"]
    assert "/proc/asound" in masked and "/proc/kcore" in masked
    assert not {"/sys/firmware", "/sys/kernel/debug", "/proc/acpi"} & set(masked)


def test_default_spec_is_the_old_one(profile):
    spec = oci.build_config(_cfg(), seccomp_profile=profile)
    shm = next(m for m in spec["mounts"] if m["destination"] == "/dev/shm")
    assert shm["type"] == "tmpfs" and "size=65536k" in shm["options"]
    assert set(oci.MASKED_DIRS) <= set(spec["linux"]["maskedPaths"])


def test_superblocks_counts_binds_once():
    info = ("73 48 0:41 / / rw,relatime - overlay overlay rw,lowerdir=/l\n"
            "74 73 0:45 / /proc rw,nosuid - proc proc rw\n"
            "49 74 0:45 /bus /proc/bus ro,nosuid - proc proc rw\n"
            "80 79 254:0 /st/empty /sys/firmware ro,nosuid shared:1 - ext4 /dev/vda rw\n")
    assert mounts.superblocks(info) == {"0:41": ("/", "overlay"), "0:45": ("/proc", "proc"),
                                        "254:0": ("/sys/firmware", "ext4")}
