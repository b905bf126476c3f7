"""Create-to-first-exec latency and create_many rate, beside plain `runc run` and `podman run`.

Targets (issue 2): create + first exec p50 <= 20 ms; create_many(200) >= 100 creations/s
on 2 cores. The baselines run a busybox bundle built here (no registry): `runc run -d` on a
bundle with a read-only rootfs, and `podman run --rm` of the same rootfs `podman import`ed
into a throw-away podman storage.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import common

import dsec
from dsec.images.busybox import build_busybox_rootfs

SPEC = {"memory_mb": 128, "cpu": 0.25}  # admission caps reserved CPUs at 64 per core


# ---- dsec ----
async def dsec_sequential(client: dsec.AsyncClient, n: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"create+exec": [], "create": [], "first exec": [],
                                   "stop": []}
    for _ in range(n):
        t0 = time.perf_counter()
        sb = await client.create(**SPEC)
        t1 = time.perf_counter()
        r = await sb.exec(["true"])
        t2 = time.perf_counter()
        await sb.stop()
        t3 = time.perf_counter()
        assert r.exit_code == 0, r
        out["create+exec"].append(t2 - t0)
        out["create"].append(t1 - t0)
        out["first exec"].append(t2 - t1)
        out["stop"].append(t3 - t2)
    return out


async def dsec_many(client: dsec.AsyncClient, n: int) -> tuple[int, float, float, list[str]]:
    t0 = time.perf_counter()
    made = await client.create_many(n, **SPEC)
    t1 = time.perf_counter()
    await asyncio.gather(*(sb.stop() for sb in made))
    t2 = time.perf_counter()
    return len(made), t1 - t0, t2 - t1, [sb.id for sb in made]


# ---- runc ----
def make_bundle(root: Path) -> Path:
    bundle = root / "bundle"
    (bundle / "rootfs").mkdir(parents=True)
    build_busybox_rootfs(bundle / "rootfs")
    common.sh("runc", "spec", "--bundle", str(bundle))
    cfg = json.loads((bundle / "config.json").read_text())
    cfg["process"]["terminal"] = False
    cfg["process"]["args"] = ["/bin/sleep", "3600"]
    (bundle / "config.json").write_text(json.dumps(cfg))
    return bundle


def runc_cmd(runc_root: Path, *args: str) -> None:
    # No pipes: a detached container inherits runc's stdio and would hold a pipe open.
    r = subprocess.run(["runc", "--root", str(runc_root), *args], stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if r.returncode != 0:
        raise RuntimeError(f"runc {' '.join(args)}: exit {r.returncode}")


def runc_sequential(runc_root: Path, bundle: Path, n: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"run+exec": [], "run": [], "first exec": [], "delete": []}
    for i in range(n):
        cid = f"bench-seq-{i}"
        t0 = time.perf_counter()
        runc_cmd(runc_root, "run", "-d", "-b", str(bundle), cid)
        t1 = time.perf_counter()
        runc_cmd(runc_root, "exec", cid, "true")
        t2 = time.perf_counter()
        runc_cmd(runc_root, "delete", "--force", cid)
        t3 = time.perf_counter()
        out["run+exec"].append(t2 - t0)
        out["run"].append(t1 - t0)
        out["first exec"].append(t2 - t1)
        out["delete"].append(t3 - t2)
    return out


def runc_parallel(runc_root: Path, bundle: Path, n: int, workers: int) -> tuple[float, float]:
    ids = [f"bench-par-{i}" for i in range(n)]
    with ThreadPoolExecutor(workers) as pool:
        t0 = time.perf_counter()
        list(pool.map(lambda c: runc_cmd(runc_root, "run", "-d", "-b", str(bundle), c), ids))
        t1 = time.perf_counter()
        list(pool.map(lambda c: runc_cmd(runc_root, "delete", "--force", c), ids))
        t2 = time.perf_counter()
    return t1 - t0, t2 - t1


# ---- podman ----
PODMAN_RUN = ["run", "--rm", "--network", "none"]
# podman's default rlimits (nofile 1048576, nproc 4194304) exceed this host's hard limits
PODMAN_ULIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]


class Podman:
    def __init__(self, root: Path) -> None:
        self.base = ["podman", "--root", str(root / "storage"), "--runroot", str(root / "run")]
        self.root = root
        self.note = ""

    def run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*self.base, *args], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL)

    def setup(self, rootfs: Path) -> str | None:
        """None when podman runs here, else the exact error."""
        if not shutil.which("podman"):
            return "podman not installed (apt-get install -y podman)"
        self.root.mkdir(parents=True, exist_ok=True)
        tar = self.root / "rootfs.tar"
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tar), "."], check=True)
        r = self.run("import", str(tar), "bench-busybox")
        if r.returncode != 0:
            return f"podman import: {r.stderr.strip()}"
        r = self.run(*PODMAN_RUN, "bench-busybox", "true")
        if r.returncode == 0:
            return None
        default_err = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode
        r = self.run(*PODMAN_RUN, *PODMAN_ULIMITS, "bench-busybox", "true")
        if r.returncode != 0:
            return f"podman run: {r.stderr.strip()}"
        PODMAN_RUN.extend(PODMAN_ULIMITS)
        self.note = (f"`podman run` with its default rlimits fails here (`{default_err}`); "
                     f"measured with `{' '.join(PODMAN_ULIMITS)}`.")
        return None

    def loop(self, n: int) -> list[float]:
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            r = self.run(*PODMAN_RUN, "bench-busybox", "true")
            out.append(time.perf_counter() - t0)
            if r.returncode != 0:
                raise RuntimeError(f"podman run: {r.stderr.strip()}")
        return out

    def runtime(self) -> str:
        r = self.run("info", "--format", "{{.Host.OCIRuntime.Name}} {{.Host.CgroupManager}}")
        return r.stdout.strip()

    def teardown(self) -> None:
        self.run("rm", "-af")
        self.run("rmi", "-af")
        self.run("system", "reset", "-f")


def _remove_podman_cgroups(existed: set[str]) -> None:
    """podman leaves an empty libpod_parent/conmon cgroup behind; remove it if we made it."""
    for d in Path("/sys/fs/cgroup").glob("*/libpod_parent"):
        if str(d) in existed:
            continue
        for sub in (d / "conmon", d):
            try:
                sub.rmdir()
            except OSError:
                pass


def _mounts_under(path: Path) -> list[str]:
    return [ln.split(" ")[4] for ln in Path("/proc/self/mountinfo").read_text().splitlines()
            if ln.split(" ")[4].startswith(str(path))]


# ---- main ----
def row(name: str, xs: list[float], base: float | None) -> list[object]:
    s = common.summary(xs)
    return [name, s["n"], common.fmt_ms(s["p50"]), common.fmt_ms(s["p90"]),
            common.ratio(s["p50"], base) if base else "—"]


def pool_size(srv) -> int:
    """Warm sandboxes waiting: sandbox dirs that no listed sandbox owns."""
    import httpx
    listed = httpx.get(f"{srv.url}/v1/sandboxes", timeout=30,
                       headers={"authorization": f"Bearer {srv.token}"}).json()["sandboxes"]
    return len(list((srv.state_dir / "sandboxes").iterdir())) - len(listed)


async def wait_pool(srv, n: int, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while pool_size(srv) < n:
        if time.time() > deadline:
            raise RuntimeError(f"warm pool did not reach {n} in {timeout:.0f} s")
        await asyncio.sleep(0.05)


async def run_dsec(n_seq: int, n_many: int, pool: int) -> dict:
    """One server: sequential create+exec+stop, then create_many; with a warm pool the
    pool is refilled before each sequential create and before create_many."""
    args = ["--warm-pool", f"busybox={pool}"] if pool else []
    with common.server(args) as srv:
        async with dsec.AsyncClient(srv.url, srv.token) as client:
            for _ in range(2):  # warm-up: layer mounts, agent binary in page cache
                await (await client.create(**SPEC)).stop()
            seq: dict[str, list[float]] = {}
            for _ in range(n_seq):
                if pool:
                    await wait_pool(srv, pool)
                for k, v in (await dsec_sequential(client, 1)).items():
                    seq.setdefault(k, []).extend(v)
            if pool:
                await wait_pool(srv, pool)
            made, t_many, t_stop, _ = await dsec_many(client, n_many)
    return {"seq": seq, "made": made, "t_many": t_many, "t_stop": t_stop, "left": srv.left}


async def main(quick: bool) -> None:
    n_seq, n_many, n_runc, n_podman = (5, 20, 5, 3) if quick else (100, 200, 100, 30)
    pool = n_many  # a pool sized for the burst; beyond it, creations run at the cold rate
    tmp = Path(tempfile.mkdtemp(prefix="dsec-bench-create-"))
    runc_root = tmp / "runc"
    podman = Podman(tmp / "podman")
    libpod_before = {str(d) for d in Path("/sys/fs/cgroup").glob("*/libpod_parent")}
    notes: list[str] = []
    try:
        bundle = make_bundle(tmp)
        cold = await run_dsec(n_seq, n_many, 0)
        warm = await run_dsec(n_seq, n_many, pool)
        runc_sequential(runc_root, bundle, 2)  # warm-up
        rseq = runc_sequential(runc_root, bundle, n_runc)
        t_rpar, t_rpar_del = runc_parallel(runc_root, bundle, n_many, 8)
        podman_err = podman.setup(bundle / "rootfs")
        pod = podman.loop(n_podman) if podman_err is None else []
        runtime = podman.runtime() if podman_err is None else ""
        runc_left = common.sh("runc", "--root", str(runc_root), "list", "-q").stdout.split()
    finally:
        for cid in common.sh("runc", "--root", str(runc_root), "list", "-q",
                             check=False).stdout.split():
            common.sh("runc", "--root", str(runc_root), "delete", "--force", cid, check=False)
        podman.teardown()
        _remove_podman_cgroups(libpod_before)
        stray = common.mounts_under(tmp)
        shutil.rmtree(tmp, ignore_errors=True)

    base = common.percentile(rseq["run+exec"], 50)
    lat = []
    for label, res in (("cold", cold), (f"warm pool of {pool}", warm)):
        seq = res["seq"]
        lat += [
            row(f"dsec create + first exec, {label}", seq["create+exec"], base),
            row("… of which create", seq["create"], common.percentile(rseq["run"], 50)),
            row("… of which first exec", seq["first exec"],
                common.percentile(rseq["first exec"], 50)),
            row("… then stop", seq["stop"], common.percentile(rseq["delete"], 50)),
        ]
    lat += [
        row("`runc run -d` + `runc exec true` (baseline)", rseq["run+exec"], base),
        row("… `runc run -d`", rseq["run"], None),
        row("… `runc exec true`", rseq["first exec"], None),
        row("… `runc delete --force`", rseq["delete"], None),
    ]
    if podman_err is None:
        lat.append(row(f"`podman run --rm … true` ({runtime})", pod, base))
    else:
        lat.append(["`podman run --rm … true`", 0, f"failed: {podman_err}", "—", "—"])
    rbase, rdel = n_many / t_rpar, n_many / t_rpar_del
    rate = []
    for label, res in (("cold", cold), (f"warm pool of {pool}", warm)):
        made, t_many, t_stop = res["made"], res["t_many"], res["t_stop"]
        rate += [
            [f"dsec `create_many({n_many})`, {label}", made, f"{t_many:.2f}",
             f"{made / t_many:.0f}", common.ratio(made / t_many, rbase)],
            [f"… then stop all {made} (concurrent DELETEs)", made, f"{t_stop:.2f}",
             f"{made / t_stop:.0f}", common.ratio(made / t_stop, rdel)],
        ]
    seq_rate = 1 / common.percentile(rseq["run"], 50)
    rate += [
        [f"`runc run -d` ×{n_many}, 8 at once (baseline)", n_many, f"{t_rpar:.2f}",
         f"{rbase:.0f}", "1.00×"],
        [f"… `runc delete --force` ×{n_many}, 8 at once", n_many, f"{t_rpar_del:.2f}",
         f"{rdel:.0f}", "1.00×"],
        ["`runc run -d` sequential loop (1 / p50)", n_runc, "—", f"{seq_rate:.0f}",
         common.ratio(seq_rate, rbase)],
    ]
    if podman_err is None:
        prate = 1 / common.percentile(pod, 50)
        rate.append(["`podman run --rm` sequential loop (1 / p50)", n_podman, "—",
                     f"{prate:.0f}", common.ratio(prate, rbase)])
    body = "\n".join([
        "Latency (sequential, one at a time):", "",
        common.table(["path", "n", "p50 ms", "p90 ms", "p50 / runc"], lat), "",
        "Throughput:", "",
        common.table(["what", "count", "seconds", "per second", "rate / runc ×8"], rate)])
    for label, res in (("cold", cold), (f"warm pool of {pool}", warm)):
        p50 = common.percentile(res["seq"]["create+exec"], 50)
        r = res["made"] / res["t_many"]
        notes += [
            f"{label}: create + first exec p50 {common.fmt_ms(p50)} ms (target ≤ 20 ms: "
            f"{'met' if p50 <= 0.020 else 'NOT met'}); create_many({n_many}) {r:.0f}/s "
            f"(target ≥ 100/s for 200: "
            f"{('met' if r >= 100 else 'NOT met') if n_many >= 200 else 'n/a in --quick'})."]
        if res["made"] < n_many:
            notes.append(f"{label}: create_many made only {res['made']} of {n_many}.")
    notes += [
        f"dsec spec: busybox, memory_mb={SPEC['memory_mb']}, cpu={SPEC['cpu']}. Warm pool: "
        f"`--warm-pool busybox={pool}`, full before each sequential create and before "
        "create_many, so the burst is served from the pool; a longer burst continues at the "
        "cold rate (the pool refills one sandbox at a time, and only between user creates).",
        "The runc baseline is a bare `runc spec` bundle (read-only busybox rootfs, no "
        "overlay, no tmpfs, no agent, no seccomp profile); `runc delete --force` polls every "
        "100 ms for the init to die.",
    ]
    if podman.note:
        notes.append(podman.note)
    left = cold["left"] + warm["left"] + runc_left + stray
    notes.append("Cleanup: " + ("nothing left (runc list empty, no mounts, no sandbox dirs, "
                                "no dsec/<id> cgroups)" if not left else f"LEFT: {left}"))
    name = "create-quick" if quick else "create"
    common.publish(name, "Create-to-first-exec and create_many rate"
                   + (" (quick)" if quick else ""), body, notes)
    if left:
        raise SystemExit(f"leftovers: {left}")


if __name__ == "__main__":
    args = common.parse_args(__doc__)
    asyncio.run(main(args.quick))
