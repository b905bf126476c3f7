#!/usr/bin/env python3
"""Build the Debian base image (``debian:12``, also tagged ``python:3.11``) into a state dir.

    python scripts/build_debian_image.py --state-dir DIR [--force] [--variant sandboxfusion]

The rootfs is made by ``mmdebstrap --variant=minbase`` from the Debian package registry,
with only python3, git, gcc, g++ and the C library headers on top (so the fncall backend can
run Python, bash, C and C++). It is kept small: no documentation, man pages or locales, no
apt lists or caches, /dev left empty (runc mounts its own).

``--variant sandboxfusion`` builds ``sandboxfusion:1`` instead: the same base plus every
toolchain of SandboxFusion's language list that Debian packages (Go, Java, Node.js,
TypeScript, Rust, PHP, Ruby, Perl, Lua, R, C#/Mono, Scala, Kotlin, D, Verilog, Racket,
SQLite, JUnit, GoogleTest, pytest, Jest), for ``dsec.integrations.sandboxfusion``. It is
large (a few GB) and its first build takes a while; ``make images`` builds it.

Idempotent and cheap to repeat: the rootfs tarball is cached (``$DSEC_CACHE_DIR``, else
``~/.cache/dsec``) and reused for every state dir; a state dir that already has the tag is
left alone. The first build takes a few minutes; importing the cached tarball, seconds.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

SUITE = "bookworm"
BASE_PACKAGES = ["python3", "git", "gcc", "g++", "libc6-dev", "ca-certificates"]
# what each SandboxFusion language needs (dsec/integrations/sandboxfusion/languages.py runs
# them; a language whose tool an image lacks answers "language not available")
FUSION_PACKAGES = ["golang-go", "default-jdk-headless", "nodejs", "node-typescript",
                   "ts-node", "rustc", "php-cli", "ruby", "perl", "lua5.4", "r-base-core",
                   "mono-mcs", "scala", "kotlin", "ldc", "iverilog", "racket", "sqlite3",
                   "junit5", "libgtest-dev", "python3-pytest", "jest", "coreutils"]
VARIANTS = {
    "debian": (("debian:12", "python:3.11"), BASE_PACKAGES, "v2"),
    "sandboxfusion": (("sandboxfusion:1",), BASE_PACKAGES + FUSION_PACKAGES, "fusion-v1"),
}
EXCLUDES = ["/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*",
            "/usr/share/lintian/*", "/usr/share/linda/*"]


def cache_dir() -> pathlib.Path:
    env = os.environ.get("DSEC_CACHE_DIR")
    return pathlib.Path(env) if env else pathlib.Path.home() / ".cache" / "dsec"


def build_tarball(dest: pathlib.Path, packages: list[str]) -> None:
    """Run mmdebstrap into ``dest`` (a tar), atomically."""
    if shutil.which("mmdebstrap") is None:
        sys.exit("mmdebstrap not found: apt-get install -y mmdebstrap")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".partial.tar")
    cmd = ["mmdebstrap", "--variant=minbase", "--mode=root", "--format=tar",
           f"--include={','.join(packages)}", "--skip=output/dev",
           '--aptopt=Acquire::Retries "3"',
           # openjdk's postinst links its man page there even when man pages are excluded
           '--setup-hook=mkdir -p "$1"/usr/share/man/man1']
    cmd += [f"--dpkgopt=path-exclude={p}" for p in EXCLUDES]
    # /usr/share/doc copyright files are kept by convention in Debian images
    cmd += ["--dpkgopt=path-include=/usr/share/doc/*/copyright",
            '--customize-hook=rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* '
            '"$1"/var/log/*.log "$1"/usr/share/python-wheels',
            # compile the standard library once so no process inside writes __pycache__
            '--customize-hook=chroot "$1" python3 -m compileall -q -j0 /usr/lib/python3.11 '
            '|| true']
    cmd += [SUITE, str(tmp)]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    tmp.rename(dest)


def import_into(state_dir: pathlib.Path, tarball: pathlib.Path, tags: tuple[str, ...]) -> str:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "src"))
    from dsec.images import ImageService
    from dsec.images.models import ImageConfig

    config = ImageConfig(
        env={"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
             "HOME": "/root", "LANG": "C.UTF-8"},
        cwd="/", user="root", entrypoint=["/bin/bash"],
        labels={"org.dsec.image": tags[0], "org.dsec.python": "3.11"})
    svc = ImageService(state_dir)
    with tempfile.TemporaryDirectory(dir=state_dir) as tmp:
        root = pathlib.Path(tmp) / "rootfs"
        root.mkdir()
        # unpack as root with tar (keeps owners, modes, xattrs), then import the directory
        subprocess.run(["tar", "-xf", str(tarball), "-C", str(root), "--numeric-owner",
                        "--xattrs", "--xattrs-include=*"], check=True)
        (root / "dev").mkdir(mode=0o755, exist_ok=True)  # a mount point; nodes are skipped
        info = svc.import_rootfs(root, tag=tags[0], config=config)
    for extra in tags[1:]:
        svc.tag(extra, tags[0])
    return info.manifest_digest or ""


def has_tags(state_dir: pathlib.Path, tags: tuple[str, ...]) -> bool:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "src"))
    from dsec.images import ImageService
    svc = ImageService(state_dir)
    try:
        for t in tags:
            svc.manifest_digest(t)
    except Exception:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--state-dir", type=pathlib.Path,
                   default=pathlib.Path(os.environ.get("DSEC_STATE_DIR", "/var/lib/dsec")))
    p.add_argument("--force", action="store_true", help="rebuild the cached rootfs tarball")
    p.add_argument("--tarball-only", action="store_true", help="only build the cached tarball")
    p.add_argument("--variant", choices=sorted(VARIANTS), default="debian",
                   help="debian (debian:12, python:3.11) or sandboxfusion (sandboxfusion:1)")
    a = p.parse_args(argv)
    tags, packages, version = VARIANTS[a.variant]
    tarball = cache_dir() / f"debian-{SUITE}-minbase-{version}.tar"
    if a.force or not tarball.exists():
        build_tarball(tarball, packages)
    if a.tarball_only:
        print(tarball)
        return 0
    a.state_dir.mkdir(parents=True, exist_ok=True)
    if not a.force and has_tags(a.state_dir, tags):
        print(f"{', '.join(tags)} already in {a.state_dir}")
        return 0
    digest = import_into(a.state_dir, tarball, tags)
    print(f"{', '.join(tags)} -> {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
