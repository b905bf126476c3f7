"""virtio-pmem with DAX for read-only layers: can a microvm guest map a layer file directly?

Issue 12 asks for one host page-cache copy of each read-only layer for every guest
(virtio-pmem + DAX, as Kata does), measured or explained. This probe asks the two things it
needs: (1) does the guest kernel dsec boots have the drivers (virtio_pmem, libnvdimm with
fsdax, FS_DAX, EROFS), from its config and module tree; (2) does QEMU map a
``virtio-pmem-pci`` device's memory into the guest's physical address space on the machine
dsec's microvm backend uses (``microvm``) and on ``q35`` (the vm backend's), from QMP
``query-memory-devices`` and the flat memory tree. No guest is booted (``-S``).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

import common

KERNEL_OPTS = ["CONFIG_VIRTIO_PMEM", "CONFIG_LIBNVDIMM", "CONFIG_BLK_DEV_PMEM", "CONFIG_ND_PFN",
               "CONFIG_ZONE_DEVICE", "CONFIG_DAX", "CONFIG_FS_DAX", "CONFIG_EROFS_FS"]
MACHINES = ["microvm,pcie=on", "q35"]


def kernel_config() -> tuple[str, dict[str, str]]:
    """The guest kernel (the newest Debian one installed, what guest.py packs) and the
    options above from its config."""
    configs = sorted(Path("/boot").glob("config-*"))
    if not configs:
        return "none", {}
    cfg = configs[-1]
    vals = {}
    for line in cfg.read_text().splitlines():
        key, _, val = line.partition("=")
        if key in KERNEL_OPTS:
            vals[key] = val
    return cfg.name.removeprefix("config-"), vals


def probe(machine: str, backing: Path) -> tuple[object, list[str]]:
    """(memaddr QEMU gave the device, memory-tree lines naming its backend)."""
    cmds = [{"execute": "qmp_capabilities"}, {"execute": "query-memory-devices"},
            {"execute": "human-monitor-command", "arguments": {"command-line": "info mtree -f"}},
            {"execute": "quit"}]
    argv = ["qemu-system-x86_64", "-M", machine, "-accel", "tcg", "-m", "128,slots=2,maxmem=1G",
            "-nodefaults", "-display", "none", "-S", "-qmp", "stdio",
            "-object", f"memory-backend-file,id=m0,mem-path={backing},size=4M,share=off,"
                       "readonly=on",
            "-device", "virtio-pmem-pci,memdev=m0,id=p0"]
    out = subprocess.run(argv, input="\n".join(json.dumps(c) for c in cmds) + "\n",
                         capture_output=True, text=True, timeout=60).stdout
    rets = [m["return"] for m in map(json.loads, filter(None, out.splitlines()))
            if "return" in m]
    devs, mtree = rets[1], rets[2]
    memaddr = devs[0]["data"]["memaddr"] if devs else None
    return memaddr, sorted({ln.strip() for ln in mtree.splitlines() if ": m0" in ln})


def main() -> None:
    common.parse_args(__doc__)
    kver, opts = kernel_config()
    rows = [[f"guest kernel {kver}: {k}", opts.get(k, "not set")] for k in KERNEL_OPTS]
    with tempfile.TemporaryDirectory(prefix="dsec-pmem-") as tmp:
        backing = Path(tmp) / "layer.img"
        backing.write_bytes(b"\0" * (4 << 20))
        for m in MACHINES:
            addr, lines = probe(m, backing)
            rows.append([f"QEMU -M {m}: virtio-pmem-pci memaddr",
                         "0 (not plugged)" if not addr else hex(addr)])
            rows.append([f"QEMU -M {m}: guest physical map of its memory",
                         "; ".join(lines) or "absent (the guest can never read it)"])
    qemu = common.sh("qemu-system-x86_64", "--version").stdout.splitlines()[0]
    notes = [
        f"{qemu}. The guest kernel has every driver (modules virtio_pmem, nd_pmem, nd_pfn; "
        "FS_DAX built in; EROFS has dax=always since 5.15), by its config: the guest side "
        "is not what stops it (not booted with a pmem device here, as QEMU never maps one).",
        "The microvm machine accepts the device (with pcie=on) but never plugs it as a "
        "memory device: QMP reports memaddr 0 and the flat memory tree has no region for "
        "its backend, so a guest would find nothing at the address the device announces. "
        "q35 plugs it into its device-memory window at 4 GiB. So virtio-pmem layers cannot "
        "work on dsec's microvm guests with this QEMU; the vm backend (q35) could map "
        "them, but its image is one merged disk (a qcow2 per image, shared read-only by "
        "every vm of it), not separate EROFS layers.",
        "Not tried, from the kernel's pmem driver: even on q35 a virtio-pmem namespace is "
        "raw (no struct pages, so no DAX for a filesystem on it) until a pfn info block is "
        "written into the device (ndctl create-namespace -m fsdax --map=mem), i.e. each "
        "layer would need a prepared copy, not the layer blob as stored.",
        "What guests share today instead: every guest reads the same layer blob files "
        "through virtio-blk, so the host keeps one page-cache copy of them, and the guest "
        "keeps its own copy in guest RAM (KSM merges equal guest pages: 37.8 MiB per idle "
        "guest with KSM vs 128.4 MiB without, section microvm).",
    ]
    common.publish("density_pmem", "virtio-pmem + DAX for guests' read-only layers: why not "
                                   "on microvm (issue 12)",
                   common.table(["what", "found"], rows), notes)


if __name__ == "__main__":
    main()
