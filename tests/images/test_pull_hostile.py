"""Pulls from a registry that lies or fails: each a specific error, nothing left in the store.

A real registry never serves a blob that does not hash to its name, so these cases use a
small fake registry (http.server on loopback) that answers whatever the test tells it to.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import http.server
import json
import threading

import pytest

from dsec.api.errors import InvalidArgument, Unavailable
from dsec.images import ImageService, TarLimits
from dsec.images.registry import RegistryAuth
from tests.images.tarutil import d, entry, make_tar
from tests.support.registry import free_port

INSECURE = RegistryAuth(insecure=True)
GOOD = make_tar([d("etc"), entry("etc/hello", b"hello\n")])
OCI = "application/vnd.oci.image.manifest.v1+json"


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Fake:
    """routes: path -> (status, headers, body); every request is recorded."""

    def __init__(self) -> None:
        self.routes: dict[str, tuple[int, dict, bytes]] = {}
        self.seen: list[tuple[str, dict]] = []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self, body_too: bool) -> None:
                fake.seen.append((self.path, dict(self.headers)))
                route = fake.routes.get(self.path.split("?")[0]) or fake.routes.get(self.path)
                if callable(route):
                    route = route(self)
                status, headers, body = route or (404, {}, b'{"errors":[]}')
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                if "Content-Length" not in headers:
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if body_too:
                    self.wfile.write(body)

            def do_GET(self) -> None:
                self._answer(True)

            def do_HEAD(self) -> None:
                self._answer(False)

            def log_message(self, *a) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def image(self, repo: str, tag: str, tars: list[bytes], *, layer_blobs=None,
              sizes=None, diff_ids=None) -> dict:
        """Serve an image; ``layer_blobs``/``sizes`` replace what is served or declared."""
        blobs = [gzip.compress(t, mtime=0) for t in tars]
        config = json.dumps({"architecture": "amd64", "os": "linux", "config": {},
                             "rootfs": {"type": "layers", "diff_ids": diff_ids or [
                                 _digest(t) for t in tars]}}).encode()
        manifest = {"schemaVersion": 2, "mediaType": OCI,
                    "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                               "digest": _digest(config), "size": len(config)},
                    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                                "digest": _digest(b), "size": (sizes or {}).get(i, len(b))}
                               for i, b in enumerate(blobs)]}
        data = json.dumps(manifest).encode()
        self.routes[f"/v2/{repo}/manifests/{tag}"] = (
            200, {"Content-Type": OCI, "Docker-Content-Digest": _digest(data)}, data)
        self.routes[f"/v2/{repo}/blobs/{_digest(config)}"] = (200, {}, config)
        for i, b in enumerate(blobs):
            served = (layer_blobs or {}).get(i, b)
            self.routes[f"/v2/{repo}/blobs/{_digest(b)}"] = (200, {}, served)
        return manifest

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake():
    f = Fake()
    yield f
    f.close()


def _assert_clean(svc: ImageService) -> None:
    """Nothing of a failed pull in the store: no tag, manifest, layer or temp file."""
    assert svc.store.tags() == {}
    assert svc.store.manifest_digests() == set()
    assert svc.store.blob_digests() == set()
    assert list(svc.store.tmp.iterdir()) == []


def test_manifest_digest_mismatch(svc, fake):
    fake.image("team/env", "v1", [GOOD])
    status, headers, body = fake.routes["/v2/team/env/manifests/v1"]
    headers["Docker-Content-Digest"] = _digest(b"something else")
    with pytest.raises(InvalidArgument, match=r"manifest of image .*team/env:v1 .*hashes to"):
        svc.pull_registry(f"{fake.host}/team/env:v1", auth=INSECURE)
    _assert_clean(svc)


def test_layer_digest_mismatch_names_image_and_layer(svc, fake):
    blob = gzip.compress(GOOD, mtime=0)
    evil = bytearray(blob)
    evil[-10] ^= 0xFF
    m = fake.image("team/env", "v1", [GOOD], layer_blobs={0: bytes(evil)})
    layer = m["layers"][0]["digest"]
    with pytest.raises(InvalidArgument, match=rf"image .*team/env:v1 layer {layer} is corrupted"):
        svc.pull_registry(f"{fake.host}/team/env:v1", auth=INSECURE)
    _assert_clean(svc)


def test_truncated_blob(svc, fake):
    blob = gzip.compress(GOOD, mtime=0)
    m = fake.image("team/env", "v1", [GOOD], layer_blobs={0: blob[:-20]},
                   sizes={0: len(blob)})
    # the server says Content-Length of what it sends: the client sees a short blob
    with pytest.raises(InvalidArgument, match=rf"layer {m['layers'][0]['digest']} is truncated"):
        svc.pull_registry(f"{fake.host}/team/env:v1", auth=INSECURE)
    _assert_clean(svc)


def test_401_then_500_is_unavailable_naming_the_image(svc, fake):
    fake.image("team/env", "v1", [GOOD])
    realm = f"http://{fake.host}/token"
    calls = []

    def manifest(handler):
        calls.append(handler.headers.get("Authorization"))
        if len(calls) == 1:
            return 401, {"WWW-Authenticate": f'Bearer realm="{realm}",service="fake",'
                                             f'scope="repository:team/env:pull"'}, b""
        return 500, {}, b"boom"

    fake.routes["/v2/team/env/manifests/v1"] = manifest
    fake.routes["/token"] = (200, {}, b'{"token": "t0ken"}')
    with pytest.raises(Unavailable, match=r"answered 500 for manifest of image .*team/env:v1"):
        svc.pull_registry(f"{fake.host}/team/env:v1", auth=INSECURE)
    assert calls == [None, "Bearer t0ken"]  # the token was fetched and used
    _assert_clean(svc)


def test_50_gib_layer_claim_is_refused_before_download(svc, fake):
    m = fake.image("team/env", "v1", [GOOD], sizes={0: 50 << 30})
    layer = m["layers"][0]["digest"]
    with pytest.raises(InvalidArgument, match=rf"layer {layer} claims 53687091200 bytes"):
        svc.pull_registry(f"{fake.host}/team/env:v1", auth=INSECURE)
    assert not any(layer in p for p, _ in fake.seen)
    _assert_clean(svc)


def test_tar_bomb_is_refused(tmp_path, fake):
    small = ImageService(tmp_path / "s", limits=TarLimits(max_bytes=1 << 20))
    bomb = make_tar([entry("zeros", b"\0" * (8 << 20))])  # 8 MiB of zeros, 8 KiB gzipped
    m = fake.image("team/bomb", "v1", [bomb])
    with pytest.raises(InvalidArgument, match=rf"image .*team/bomb:v1 layer "
                                              rf"{m['layers'][0]['digest']}.*exceeds the limit"):
        small.pull_registry(f"{fake.host}/team/bomb:v1", auth=INSECURE)
    _assert_clean(small)


def test_symlink_chain_out_of_root_is_refused(svc, fake):
    chain = make_tar([d("a"), entry("a/up", type=b"2", linkname=".."),
                      entry("a/out", type=b"2", linkname="up/../../etc")])
    fake.image("team/link", "v1", [chain])
    with pytest.raises(InvalidArgument, match=r"team/link:v1 layer .*a/out.*outside the layer"):
        svc.pull_registry(f"{fake.host}/team/link:v1", auth=INSECURE)
    _assert_clean(svc)


def test_diff_id_mismatch_is_refused(svc, fake):
    fake.image("team/env", "v1", [GOOD], diff_ids=[_digest(b"other")])
    with pytest.raises(InvalidArgument, match="team/env:v1 layer .* is corrupted"):
        svc.pull_registry(f"{fake.host}/team/env:v1", auth=INSECURE)
    _assert_clean(svc)


def test_a_failed_pull_leaves_other_pulls_working(svc, fake):
    fake.image("team/env", "bad", [GOOD], sizes={0: 50 << 30})
    fake.image("team/env", "good", [GOOD])
    with pytest.raises(InvalidArgument):
        svc.pull_registry(f"{fake.host}/team/env:bad", auth=INSECURE)
    info = svc.pull_registry(f"{fake.host}/team/env:good", auth=INSECURE)
    assert info.layers == 1 and list(svc.store.tags()) == [f"{fake.host}/team/env:good"]


def test_token_auth_with_credentials_from_docker_config(svc, fake, tmp_path):
    fake.image("team/env", "v1", [GOOD])
    realm = f"http://{fake.host}/token"
    route = fake.routes["/v2/team/env/manifests/v1"]

    def manifest(handler):
        if handler.headers.get("Authorization") != "Bearer s3cret-token":
            return 401, {"WWW-Authenticate": f'Bearer realm="{realm}",service="fake"'}, b""
        return route

    def token(handler):
        ok = handler.headers.get("Authorization") == "Basic " + base64.b64encode(
            b"alice:pw").decode() and "scope=repository%3Ateam%2Fenv%3Apull" in handler.path
        return (200, {}, b'{"access_token": "s3cret-token"}') if ok else (401, {}, b"")

    fake.routes["/v2/team/env/manifests/v1"] = manifest
    fake.routes["/token"] = token
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"auths": {fake.host: {
        "auth": base64.b64encode(b"alice:pw").decode()}}}))
    auth = RegistryAuth(insecure=True, auth_file=config)
    assert svc.pull_registry(f"{fake.host}/team/env:v1", auth=auth).layers == 1


def test_basic_auth_from_flags(svc, fake):
    fake.image("team/env", "v1", [GOOD])
    want = "Basic " + base64.b64encode(b"bob:pw2").decode()
    for path, route in list(fake.routes.items()):
        def guarded(handler, route=route):
            if handler.headers.get("Authorization") != want:
                return 401, {"WWW-Authenticate": 'Basic realm="fake"'}, b""
            return route
        fake.routes[path] = guarded
    with pytest.raises(InvalidArgument, match="wants a user name and password"):
        svc.pull_registry(f"{fake.host}/team/env:v1", auth=INSECURE)
    auth = RegistryAuth(insecure=True, username="bob", password="pw2")
    assert svc.pull_registry(f"{fake.host}/team/env:v1", auth=auth).layers == 1
