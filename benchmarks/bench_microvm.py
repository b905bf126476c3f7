"""microvm guests: boot to first exec, template restore, exec round trip, idle memory.

Beside each figure its baseline: a bare QEMU boot of the same kernel and initramfs that
only prints and powers off; the agent's `true` round trip in a runc container; the idle
guests' memory with KSM off. Prints medians and which accelerator (TCG or KVM) ran them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from dsec.api.models import SandboxSpec
from dsec.images import ImageService
from dsec.node.agent.client import AgentProcess, SpawnRequest
from dsec.node.backends.base import SandboxRecord
from dsec.node.backends.microvm import MicroVMBackend, MicroVMConfig
from dsec.node.backends.microvm.accel import bare_boot

ROOT = Path(__file__).resolve().parent.parent
KSM = Path("/sys/kernel/mm/ksm")
CAT_BYTES = 16 << 20


def record(sb_id: str, memory_mb: int) -> SandboxRecord:
    now = time.time()
    return SandboxRecord(id=sb_id, spec=SandboxSpec(backend="microvm", memory_mb=memory_mb),
                         state="creating", created_at=now, last_active_at=now)


async def agent_true(connector) -> None:
    proc = await AgentProcess.start(connector, SpawnRequest(argv=["true"], env={"PATH": "/bin"}))
    proc.close_stdin()
    while (await proc.next_event())[0] != "exit":
        pass
    if proc.exit_code != 0:
        raise RuntimeError(f"true exited {proc.exit_code}")


async def boots(backend: MicroVMBackend, n: int, mem: int, warm: bool) -> list[float]:
    """Seconds from start() to the first `true` answered, cold boot or template clone."""
    backend.config.warm_start = warm
    if warm:
        await backend.ensure_template(record("sb-tpl", mem).spec)
    out = []
    for i in range(n):
        rec = record(f"sb-bench-{'w' if warm else 'c'}{i}", mem)
        t0 = time.perf_counter()
        try:
            rec.runtime = await backend.start(rec)
            await agent_true(backend.connector(rec))
            out.append(time.perf_counter() - t0)
        finally:
            await backend.stop(rec)
    return out


async def bare_boots(backend: MicroVMBackend, n: int, accel: str) -> list[float]:
    art = await backend.artifacts()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        if not await bare_boot(backend.config.qemu, art, accel, 120):  # type: ignore[arg-type]
            raise RuntimeError("bare boot did not print its marker")
        out.append(time.perf_counter() - t0)
    return out


async def cat_seconds(connector, size: int, n: int = 3) -> list[float]:
    """Seconds to send ``size`` bytes through `cat` in the sandbox and read them back."""
    data = os.urandom(size)
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        proc = await AgentProcess.start(connector, SpawnRequest(argv=["cat"],
                                                                env={"PATH": "/bin"}))
        proc.write_stdin(data)
        proc.close_stdin()
        got = bytearray()
        while True:
            kind, chunk = await proc.next_event()
            if kind == "exit":
                break
            got += chunk
        if bytes(got) != data:
            raise RuntimeError("cat returned different bytes")
        out.append(time.perf_counter() - t0)
    return out


async def rtts(connector, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await agent_true(connector)
        out.append(time.perf_counter() - t0)
    return out


async def container_rtt(state: Path, images: ImageService,
                        n: int) -> tuple[list[float] | str, list[float] | str]:
    """The same `true` through the same agent in a runc container (unix socket)."""
    try:
        from dsec.node.agent.build import ensure_agent
        from dsec.node.backends.container import ContainerBackend
        cb = ContainerBackend(state, images, ensure_agent(state / "bin"))
        rec = SandboxRecord(id="sb-bench-ctr", spec=SandboxSpec(memory_mb=128), state="creating",
                            created_at=time.time(), last_active_at=time.time())
        rec.runtime = await cb.start(rec)
    except Exception as exc:  # the baseline is optional: say why it is missing
        why = f"n/a ({type(exc).__name__}: {exc})"[:120]
        return why, why
    try:
        await rtts(cb.connector(rec), 5)
        return await rtts(cb.connector(rec), n), await cat_seconds(cb.connector(rec), CAT_BYTES)
    finally:
        await cb.stop(rec)


def ksm_read(name: str) -> int:
    return int((KSM / name).read_text())


def ksm_set(**values: int) -> None:
    for k, v in values.items():
        (KSM / k).write_text(str(v))


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


async def idle_memory(backend: MicroVMBackend, n: int, mem: int, settle_s: float,
                      clones: bool) -> dict[str, float]:
    """MiB per idle guest (sum of QEMU Pss / n, and MemAvailable drop / n), KSM off then on."""
    saved = {k: ksm_read(k) for k in ("run", "pages_to_scan", "sleep_millisecs")}
    backend.config.warm_start = clones
    if clones:
        await backend.ensure_template(record("sb-tpl", mem).spec)
    recs = [record(f"sb-bench-m{i}", mem) for i in range(n)]
    out: dict[str, float] = {}
    try:
        ksm_set(run=2)  # unmerge everything: the "without KSM" figure
        await asyncio.sleep(2)
        before = mem_available()
        for r in recs:
            r.runtime = await backend.start(r)
        await asyncio.sleep(settle_s)
        out["pss_off"] = sum(backend.memory_bytes(r) for r in recs) / n / 2**20
        out["avail_off"] = (before - mem_available()) / n / 2**20
        ksm_set(run=1, pages_to_scan=20000, sleep_millisecs=10)
        start_scans = ksm_read("full_scans")
        deadline = time.monotonic() + 300
        while ksm_read("full_scans") < start_scans + 3 and time.monotonic() < deadline:
            await asyncio.sleep(1)
        out["pss_on"] = sum(backend.memory_bytes(r) for r in recs) / n / 2**20
        out["avail_on"] = (before - mem_available()) / n / 2**20
        out["sharing_mib"] = ksm_read("pages_sharing") * 4096 / 2**20
    finally:
        for r in recs:
            await backend.stop(r)
        ksm_set(run=saved["run"] if saved["run"] != 2 else 0,
                pages_to_scan=saved["pages_to_scan"], sleep_millisecs=saved["sleep_millisecs"])
    return out


async def vm_boots(state: Path, images: ImageService, n: int, mem: int,
                   warm: bool = False) -> list[float]:
    """vm backend: q35 + SeaBIOS + extlinux + the disk's own init, to the first `true`
    (``warm``: restored from a saved template instead)."""
    from dsec.node.backends.microvm import VMBackend
    vm = VMBackend(state, images, config=MicroVMConfig(guest_dir=ROOT / "build" / "guest",
                                                       ksm=False, boot_timeout_s=300,
                                                       warm_start=warm))
    out = []
    for i in range(n + 1):  # the first builds the image's disk (and template): not counted
        rec = record(f"sb-bench-vm{'w' if warm else 'c'}{i}", mem)
        rec.spec = rec.spec.model_copy(update={"backend": "vm"})
        t0 = time.perf_counter()
        try:
            rec.runtime = await vm.start(rec)
            await agent_true(vm.connector(rec))
            if i:
                out.append(time.perf_counter() - t0)
        finally:
            await vm.stop(rec)
    if warm:
        await vm.drop_templates()
    return out


def med(xs) -> str:
    if isinstance(xs, str):
        return xs
    return f"{statistics.median(xs) * 1000:.0f} ms" if xs[0] < 1 else \
        f"{statistics.median(xs):.2f} s"


async def main(args: argparse.Namespace) -> None:
    state = Path(tempfile.mkdtemp(prefix="dsec-bench-microvm-"))
    images = ImageService(state)
    try:
        images.ensure_busybox()
        backend = MicroVMBackend(state, images, config=MicroVMConfig(
            guest_dir=ROOT / "build" / "guest", ksm=False))
        accel = await backend.accel()
        n = args.n
        bare = await bare_boots(backend, n, accel)
        cold = await boots(backend, n, args.memory_mb, warm=False)
        warm = await boots(backend, n, args.memory_mb, warm=True)
        rec = record("sb-bench-rtt", args.memory_mb)
        backend.config.warm_start = True
        rec.runtime = await backend.start(rec)
        try:
            await rtts(backend.connector(rec), 5)
            vm_rtt = await rtts(backend.connector(rec), args.rtt)
            vm_cat = await cat_seconds(backend.connector(rec), CAT_BYTES)
        finally:
            await backend.stop(rec)
        ctr_rtt, ctr_cat = await container_rtt(state, images, args.rtt)
        vm = await vm_boots(state, images, max(1, n // 2), args.memory_mb) if args.vm else None
        vm_warm = await vm_boots(state, images, max(1, n // 2), args.memory_mb, warm=True) \
            if args.vm else None
        print(f"\nmicrovm, accelerator: {accel.upper()}  (medians; n={n} boots, "
              f"{args.rtt} round trips; guest {args.memory_mb} MiB)\n")
        print("| figure | dsec microvm | baseline |")
        print("|---|---|---|")
        print(f"| boot to first exec, cold | {med(cold)} | bare QEMU boot+poweroff of the same "
              f"kernel+initramfs: {med(bare)} |")
        print(f"| restore from template to first exec | {med(warm)} | cold: {med(cold)} |")
        print(f"| exec round trip of `true` | {med(vm_rtt)} (virtio-serial, multiplexed) | "
              f"runc container (unix socket): {med(ctr_rtt)} |")
        mib = CAT_BYTES >> 20
        print(f"| {mib} MiB through `cat` (stdin in, stdout back) | {med(vm_cat)} "
              f"({mib / statistics.median(vm_cat):.0f} MiB/s each way) | runc container: "
              f"{med(ctr_cat)} |")
        if vm:
            print(f"| vm (q35, own disk and init) boot to first exec | {med(vm)} | microvm cold: "
                  f"{med(cold)} |")
            print(f"| vm restore from template to first exec | {med(vm_warm)} | vm boot: "
                  f"{med(vm)} |")
        if args.guests:
            m = await idle_memory(backend, args.guests, args.memory_mb, args.settle,
                                  clones=not args.cold_memory)
            how = "cold-booted guests" if args.cold_memory else "template clones"
            print(f"| host memory per idle guest ({args.guests} {how}, Pss) | KSM on: "
                  f"{m['pss_on']:.1f} MiB | KSM off: {m['pss_off']:.1f} MiB |")
            print(f"| same, MemAvailable drop / guest | KSM on: {m['avail_on']:.1f} MiB | "
                  f"KSM off: {m['avail_off']:.1f} MiB |")
            print(f"\nKSM pages_sharing at the end: {m['sharing_mib']:.0f} MiB")
        await backend.drop_templates()
    finally:
        images.unmount_all()
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5, help="boots per figure")
    ap.add_argument("--rtt", type=int, default=100, help="exec round trips")
    ap.add_argument("--guests", type=int, default=20, help="idle guests for memory (0: skip)")
    ap.add_argument("--memory-mb", type=int, default=256, help="guest RAM")
    ap.add_argument("--settle", type=float, default=15.0, help="idle seconds before measuring")
    ap.add_argument("--cold-memory", action="store_true",
                    help="measure memory on cold-booted guests instead of template clones")
    ap.add_argument("--no-vm", dest="vm", action="store_false", help="skip the vm backend row")
    ap.add_argument("--quick", action="store_true", help="n=2, 20 round trips, 4 guests")
    a = ap.parse_args()
    if a.quick:
        a.n, a.rtt, a.guests, a.settle = 2, 20, 4, 5.0
    asyncio.run(main(a))
