"""Images from a registry: pull of a Debian image beside podman and skopeo; Dockerfile build
beside buildah; a cold node loading layers on demand from a registry store.

A real registry (Debian's ``docker-registry``) runs on loopback with its own storage. The
Debian image of ``scripts/build_debian_image.py`` (python3, git, gcc; made by mmdebstrap)
is exported by dsec as an ordinary OCI image (gzip layer) and pushed into it. Then, in
alternating order, each round pulls it into an empty store with:

- ``dsec image pull`` (fetch, verify, decompress, tarsafe extract, EROFS build),
- ``skopeo copy docker://... oci:DIR`` (fetch and verify only: no unpacking),
- ``podman pull`` into a private storage root (fetch, verify, unpack into overlay storage).

Dockerfile build: a small Python project (a requirements file, a package, a unittest
suite run by a RUN step) on debian:12, by ``dsec image build`` (checks, base exported
from the store as an OCI layout, ``buildah bud --network none``, import of the result)
beside ``buildah bud`` of the same file on the same base already in OCI layout form.

Lazy: ``bench_images_lazy``'s 100 sandboxes of 10 images sharing a base, with the images
pushed by dsec into the registry as EROFS artifacts (``--images-remote oci+http://...``),
on demand beside full pull.

    .venv/bin/python benchmarks/bench_registry.py [--quick] [--only pull,build,lazy]
"""

from __future__ import annotations

import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

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


PROJECT = {
    "requirements.txt": "# the standard library only: RUN steps have no network\n",
    "calc/__init__.py": "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n",
    "tests/__init__.py": "",
    "tests/test_calc.py": ("import unittest\n\nfrom calc import add, mul\n\n\n"
                           "class T(unittest.TestCase):\n    def test_add(self):\n"
                           "        self.assertEqual(add(2, 3), 5)\n\n    def test_mul(self):\n"
                           "        self.assertEqual(mul(2, 3), 6)\n"),
}
DOCKERFILE = """FROM {base}
WORKDIR /app
COPY requirements.txt ./
RUN test ! -s requirements.txt || grep -v '^#' requirements.txt | (! grep .)
COPY calc ./calc
COPY tests ./tests
ENV PYTHONDONTWRITEBYTECODE=1
RUN python3 -m unittest discover -s tests -v
CMD ["python3", "-m", "unittest"]
"""


def build_rounds(tmp: pathlib.Path, svc: ImageService, reps: int) -> dict[str, list[float]]:
    ctx = tmp / "project"
    for rel, text in PROJECT.items():
        (ctx / rel).parent.mkdir(parents=True, exist_ok=True)
        (ctx / rel).write_text(text)
    (ctx / "Dockerfile").write_text(DOCKERFILE.format(base="debian:12"))
    layout = tmp / "base-layout"
    svc.export_oci("debian:12", layout, compress=False)
    (ctx / "Baseline.Dockerfile").write_text(DOCKERFILE.format(base=f"oci:{layout}:12"))
    times: dict[str, list[float]] = {"dsec image build": [], "buildah bud": []}
    for i in range(reps):
        order = list(times) if i % 2 == 0 else list(reversed(times))
        for tool in order:
            if tool == "dsec image build":
                times[tool].append(timed(lambda: svc.build_dockerfile(
                    ctx / "Dockerfile", f"bench/app:{i}")))
                continue
            root = tmp / f"buildah-{i}"
            st = ["--root", str(root / "root"), "--runroot", str(root / "run"),
                  "--storage-driver", "vfs"]
            times[tool].append(timed(lambda: _run(
                "buildah", *st, "bud", "--network", "none", "--layers=false", "--pull-never",
                "-f", str(ctx / "Baseline.Dockerfile"), "-t", "localhost/bench-app", str(ctx))))
            subprocess.run(["buildah", *st, "rm", "--all"], capture_output=True)
            shutil.rmtree(root, ignore_errors=True)
    return times


def lazy_rounds(tmp: pathlib.Path, host: str, sandboxes: int, reps: int):
    """bench_images_lazy's workload with the images pushed into the registry."""
    from bench_images_lazy import build_registry, run_node

    from dsec.images import RemoteConfig

    url = f"oci+http://{host}/dsec/store"
    src, names = build_registry(tmp / "lazy")
    pusher = ImageService(tmp / "lazy" / "registry", remote=RemoteConfig(url=url))
    for n in names:
        pusher.push(n)
    manifests = [src.manifest(n) for n in names]
    images_total = sum(lr.size for m in manifests for lr in m.layers)
    unique = sum({lr.digest: lr.size for m in manifests for lr in m.layers}.values())
    results = {}
    for lazy in (True, False):
        runs = [run_node(tmp / f"node-{lazy}-{k}", url, lazy, names, sandboxes, "same")
                for k in range(reps)]
        results[lazy] = (statistics.median(r[0] for r in runs),
                         statistics.median(x for r in runs for x in r[1]),
                         statistics.median(r[2] for r in runs))
    src.unmount_all()
    return results, images_total, unique


def section_pull(tmp, reg, src, reps) -> str:
    ref = reg.ref("bench/debian:12")
    t_push = timed(lambda: src.push_registry("debian:12", ref, INSECURE))
    src.unmount_all()
    blobs = sum(p.stat().st_size for p in (reg.storage / "docker/registry/v2/blobs")
                .rglob("data"))
    times, fetched = pull_rounds(tmp, ref, reps)
    skopeo, podman = (statistics.median(times[k]) for k in ("skopeo copy", "podman pull"))
    rows = [[tool, f"{statistics.median(ts):.2f} s", f"{min(ts):.2f} s",
             f"{statistics.median(ts) / podman:.2f}x", f"{statistics.median(ts) / skopeo:.2f}x",
             mib(fetched["bytes"]) if tool.startswith("dsec") else mib(blobs)]
            for tool, ts in times.items()]
    body = table(["pull of debian:12 from a loopback registry", "median", "best",
                  "vs podman pull", "vs skopeo copy", "bytes moved"], rows)
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
    return "### Pull\n\n" + body + "\n\n" + "\n".join(f"- {n}" for n in notes)


def section_build(tmp, src, reps) -> str:
    times = build_rounds(tmp, src, reps)
    base = statistics.median(times["buildah bud"])
    rows = [[tool, f"{statistics.median(ts):.2f} s", f"{min(ts):.2f} s",
             f"{statistics.median(ts) / base:.2f}x"] for tool, ts in times.items()]
    body = table(["Dockerfile build of a small Python project on debian:12", "median",
                  "best", "vs buildah bud"], rows)
    notes = [
        "The Dockerfile: WORKDIR, COPY of a requirements file, a package and a unittest "
        "suite, a RUN checking the requirements, ENV, a RUN of the test suite, CMD. No RUN "
        "has network (both sides run `--network none`).",
        "buildah bud: the same file with FROM pointing at debian:12 already exported as an "
        "OCI layout, private vfs storage root, --layers=false; build only. dsec image "
        "build: the checks, the export of debian:12 from the store (uncompressed tar of "
        "its EROFS layer), the same buildah bud, buildah push to an OCI layout and the "
        "import (the base layer maps back to its EROFS layer; only new layers are "
        "converted).",
        f"{reps} rounds, alternating order.",
    ]
    return "### Dockerfile build\n\n" + body + "\n\n" + "\n".join(f"- {n}" for n in notes)


def section_lazy(tmp, reg, sandboxes, reps) -> str:
    results, images_total, unique = lazy_rounds(tmp, reg.host, sandboxes, reps)
    rows = []
    for label, lazy in (("on demand (range requests, 256 KiB chunks)", True),
                        ("full pull (baseline)", False)):
        fetched, lat, total = results[lazy]
        rows.append([label, mib(fetched), f"{100 * fetched / images_total:.1f} %",
                     f"{100 * fetched / unique:.1f} %", f"{lat * 1000:.1f} ms",
                     f"{total:.2f} s"])
    body = table(["cold node, registry as the layer store", "fetched", "of images' total",
                  "of distinct layers", "median create+read", f"all {sandboxes}"], rows)
    notes = [
        f"bench_images_lazy.py's workload ({sandboxes} sandboxes of 10 images = busybox + a "
        f"48 MiB base + a 7 MiB workspace each; each sandbox an overlay that reads busybox, "
        f"2 of the 20 base folders and 3 workspace folders), the images pushed by `dsec "
        f"image push --to oci+http://...` into docker-registry as EROFS artifacts; images "
        f"total {mib(images_total)}, distinct layers {mib(unique)}; median of {reps}.",
        "On demand: the lazy FUSE file reads the registry's blobs with Range requests, "
        "each 256 KiB chunk checked against the layer's chunk table. Full pull: each layer "
        "downloaded whole from the registry and verified before its first mount.",
    ]
    return ("### Cold node, registry as the layer store\n\n" + body + "\n\n"
            + "\n".join(f"- {n}" for n in notes))


def main() -> None:
    args = parse_args(__doc__, lambda p: p.add_argument(
        "--only", default="pull,build,lazy", help="comma-separated sections to run"))
    only = set(args.only.split(","))
    reps = 1 if args.quick else 3
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench-registry-"))
    parts = []
    try:
        with run_registry(tmp) as reg:
            src = ImageService(tmp / "src")
            if only & {"pull", "build"}:
                ensure_debian_image(tmp / "src")
            sections = {"pull": lambda: section_pull(tmp, reg, src, reps),
                        "build": lambda: section_build(tmp, src, reps),
                        "lazy": lambda: section_lazy(tmp, reg, 20 if args.quick else 100, reps)}
            for key, run in sections.items():
                if key in only:
                    try:
                        parts.append(run())
                    except Exception:  # the other sections' figures still count
                        traceback.print_exc()
                        print(f"section {key} failed", file=sys.stderr)
            src.unmount_all()
        # a run of some sections only gets a file of its own (RESULTS.md shows both)
        name = "registry" + ("" if only >= {"pull", "build", "lazy"} or only == {"pull", "lazy"}
                             else "_" + "_".join(sorted(only)))
        publish(name + ("-quick" if args.quick else ""), "Images from an OCI registry"
                + ("" if name == "registry" else f" ({', '.join(sorted(only))})"),
                "\n\n".join(parts))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
