"""A real OCI registry on loopback (Debian's ``docker-registry``) and OCI layouts to fill it.

``run_registry(tmp)`` starts ``docker-registry serve`` with its own config and storage
directory on a free port and stops it afterwards. ``make_layout`` writes an OCI image
layout from Python-made layer tars; ``skopeo copy`` (the real client) puts it into the
registry, optionally re-compressed (zstd) or as a Docker schema 2 manifest.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import pathlib
import socket
import subprocess
import time
from collections.abc import Iterator

import httpx

__all__ = ["Registry", "run_registry", "make_layout", "skopeo_copy", "free_port"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Registry:
    """A running registry: ``host`` is '127.0.0.1:PORT'."""

    def __init__(self, host: str, storage: pathlib.Path) -> None:
        self.host, self.storage = host, storage

    def ref(self, name: str) -> str:
        return f"{self.host}/{name}"


@contextlib.contextmanager
def run_registry(tmp: pathlib.Path, users: dict[str, str] | None = None
                 ) -> Iterator[Registry]:
    """Start docker-registry on a free loopback port; stop it and check it is gone.

    ``users``: name -> password; the registry then wants Basic auth (an htpasswd file made
    by apache2-utils' ``htpasswd -B``, the bcrypt form distribution reads)."""
    port = free_port()
    storage = tmp / "registry-data"
    storage.mkdir(parents=True)
    config = tmp / "registry.yml"
    doc = {  # YAML is a superset of JSON
        "version": 0.1, "log": {"level": "warn"},
        "storage": {"filesystem": {"rootdirectory": str(storage)}, "delete": {"enabled": True}},
        "http": {"addr": f"127.0.0.1:{port}"}}
    if users:
        lines = [subprocess.run(["htpasswd", "-Bbn", u, p], check=True, capture_output=True,
                                text=True).stdout.strip() for u, p in users.items()]
        (tmp / "htpasswd").write_text("\n".join(lines) + "\n")
        doc["auth"] = {"htpasswd": {"realm": "dsec-test", "path": str(tmp / "htpasswd")}}
    config.write_text(json.dumps(doc))
    log = open(tmp / "registry.log", "wb")
    proc = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v2/", timeout=1).status_code in (200, 401):
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("docker-registry did not start: "
                                   + (tmp / "registry.log").read_text()[-500:])
            time.sleep(0.05)
        yield Registry(f"127.0.0.1:{port}", storage)
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


def _blob(layout: pathlib.Path, data: bytes) -> dict:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    path = layout / "blobs" / "sha256" / digest.split(":")[1]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return {"digest": digest, "size": len(data)}


def make_layout(layout: pathlib.Path, layers: list[bytes], *, env: dict | None = None,
                cmd: list[str] | None = None, platforms: list[str] | None = None) -> dict:
    """Write an OCI layout of one image (or an index of one per platform, same layers).

    ``layers``: uncompressed layer tars, bottom first; stored gzip-compressed.
    Returns the image manifest dict.
    """
    layout.mkdir(parents=True, exist_ok=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    descs = [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
              **_blob(layout, gzip.compress(t, mtime=0))} for t in layers]
    manifests = []
    for plat in platforms or ["linux/amd64"]:
        os_, arch = plat.split("/")
        config = {"architecture": arch, "os": os_,
                  "config": {"Env": [f"{k}={v}" for k, v in (env or {}).items()],
                             "Cmd": cmd or ["/bin/sh"], "WorkingDir": "/"},
                  "rootfs": {"type": "layers", "diff_ids": [
                      "sha256:" + hashlib.sha256(t).hexdigest() for t in layers]}}
        manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                               **_blob(layout, json.dumps(config).encode())},
                    "layers": descs}
        desc = {"mediaType": manifest["mediaType"],
                **_blob(layout, json.dumps(manifest).encode()),
                "platform": {"os": os_, "architecture": arch}}
        manifests.append((desc, manifest))
    if len(manifests) == 1:
        desc = dict(manifests[0][0], annotations={"org.opencontainers.image.ref.name": "latest"})
        index = {"schemaVersion": 2, "manifests": [desc]}
    else:
        inner = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                 "manifests": [d for d, _ in manifests]}
        idesc = {"mediaType": inner["mediaType"], **_blob(layout, json.dumps(inner).encode()),
                 "annotations": {"org.opencontainers.image.ref.name": "latest"}}
        index = {"schemaVersion": 2, "manifests": [idesc]}
    (layout / "index.json").write_text(json.dumps(index))
    return manifests[0][1]


def skopeo_copy(layout: pathlib.Path, dest: str, *extra: str) -> None:
    """``skopeo copy oci:LAYOUT:latest docker://DEST`` over plain HTTP."""
    subprocess.run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false", *extra,
                    f"oci:{layout}:latest", f"docker://{dest}"], check=True)
