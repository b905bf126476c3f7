"""Images from a registry: pull of a Debian image beside podman and skopeo; Dockerfile build
beside buildah.

A real registry (Debian's ``docker-registry``) runs on loopback with its own storage. The
Debian image of ``scripts/build_debian_image.py`` (python3, git, gcc; made by mmdebstrap)
is exported by dsec as an ordinary OCI image (gzip layer) and pushed into it. Then, in
alternating order, each round pulls it into an empty store with:

- ``dsec image pull`` (fetch, verify, decompress, tarsafe extract, EROFS build),
- ``skopeo copy docker://... oci:DIR`` (fetch and verify only: no unpacking),
- ``podman pull`` into a private storage root (fetch, verify, unpack into overlay storage).

    .venv/bin/python benchmarks/bench_registry.py [--quick] [--skip-build]
"""

from __future__ import annotations

import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from common import parse_args, publish, table  # noqa: E402

from dsec.images import ImageService  # noqa: E402
from dsec.images.registry import RegistryAuth  # noqa: E402
from tests.support.images import ensure_debian_image  # noqa: E402
from tests.support.registry import run_registry  # noqa: E402

INSECURE = RegistryAuth(insecure=True)


def mib(n: float) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def pull_rounds(tmp: pathlib.Path, ref: str, reps: int) -> tuple[dict[str, list[float]], dict]:
    """Wall times of each tool over ``reps`` rounds, and what dsec fetched."""
    times: dict[str, list[float]] = {"dsec image pull": [], "skopeo copy": [], "podman pull": []}
    fetched: dict[str, int] = {}
    for i in range(reps):
        order = list(times) if i % 2 == 0 else list(reversed(times))
        for tool in order:
            work = tmp / f"round-{i}-{tool.split()[0]}"
            work.mkdir()
            if tool == "dsec image pull":
                svc = ImageService(work / "state")
                seen: dict[str, int] = {}

                def report(lid, state, done, total, seen=seen):
                    if state == "fetch":
                        seen[lid] = done
                times[tool].append(timed(lambda: svc.pull_registry(ref, auth=INSECURE,
                                                                   progress=report)))
                fetched = {"bytes": sum(seen.values()), "erofs": sum(
                    lr.size for lr in svc.manifest(ref).layers)}
                svc.unmount_all()
            elif tool == "skopeo copy":
                times[tool].append(timed(lambda: _run(
                    "skopeo", "copy", "--quiet", "--src-tls-verify=false", f"docker://{ref}",
                    f"oci:{work / 'layout'}:x")))
            else:
                root, runroot = work / "root", work / "run"
                times[tool].append(timed(lambda: _run(
                    "podman", "--root", str(root), "--runroot", str(runroot), "pull", "-q",
                    "--tls-verify=false", ref)))
                subprocess.run(["podman", "--root", str(root), "--runroot", str(runroot),
                                "system", "reset", "-f"], capture_output=True)
            shutil.rmtree(work, ignore_errors=True)
    return times, fetched


def main() -> None:
    args = parse_args(__doc__)
    reps = 1 if args.quick else 3
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench-registry-"))
    try:
        with run_registry(tmp) as reg:
            src_state = tmp / "src"
            ensure_debian_image(src_state)
            src = ImageService(src_state)
            ref = reg.ref("bench/debian:12")
            t_push = timed(lambda: src.push_registry("debian:12", ref, INSECURE))
            src.unmount_all()
            blobs = sum(p.stat().st_size for p in (reg.storage / "docker/registry/v2/blobs")
                        .rglob("data"))
            times, fetched = pull_rounds(tmp, ref, reps)
        base = statistics.median(times["skopeo copy"])
        rows = [[tool, f"{statistics.median(ts):.2f} s", f"{min(ts):.2f} s",
                 f"{statistics.median(ts) / base:.2f}x",
                 mib(fetched["bytes"]) if tool.startswith("dsec") else mib(blobs)]
                for tool, ts in times.items()]
        body = table(["pull of debian:12 from a loopback registry", "median", "best",
                      "vs skopeo copy", "bytes moved"], rows)
        notes = [
            f"Image: `scripts/build_debian_image.py`'s debian:12 (one layer), pushed by "
            f"`dsec image push` as an OCI image with a gzip layer in {t_push:.1f} s; the "
            f"registry holds {mib(blobs)} of blobs; the EROFS layer dsec builds from it is "
            f"{mib(fetched['erofs'])}.",
            f"{reps} rounds, tools in alternating order, each into an empty store or dir; "
            f"page cache warm (the registry's files are read from memory).",
            "skopeo copy only fetches and verifies blobs into an OCI layout (no unpacking); "
            "podman pull also unpacks the layer into its overlay storage (private --root); "
            "dsec image pull fetches, verifies the blob digest and the diff_id, extracts "
            "through tarsafe's checks and builds the EROFS layer.",
            "bytes moved: dsec counts what it received; skopeo and podman fetch every blob "
            "of the image (the registry's total is shown).",
        ]
        publish("registry", "Images from an OCI registry", body, notes)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
