"""Client of an OCI distribution registry (the protocol of Docker Hub and every registry).

Covers what dsec needs: manifests by tag or digest, blobs whole or by byte range, blob and
manifest uploads, and the two auth schemes registries use (a 401 with
``WWW-Authenticate: Bearer realm=...`` answered by fetching a token, or ``Basic``).
Credentials come from flags or from the Docker / containers auth files (``auths``
entries, or the ``credHelpers`` / ``credsStore`` helper programs they name). Every manifest is
checked against the digest asked for or the one the registry claims; blob callers check
theirs (:mod:`dsec.images.pull`). Every failure is a :class:`DSecError` naming the registry
and what was asked for.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import ipaddress
import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator

import httpx
from pydantic import BaseModel, ConfigDict, Field

from dsec.api.errors import InvalidArgument, NotFound, Unavailable
from dsec.images.refs import DOCKER_HUB, is_digest

__all__ = ["RegistryClient", "RegistryAuth", "RegistryPolicy", "parse_challenge", "load_credentials",
           "helper_get", "check_insecure", "MANIFEST_TYPES", "INDEX_TYPES"]

INDEX_TYPES = ("application/vnd.oci.image.index.v1+json",
               "application/vnd.docker.distribution.manifest.list.v2+json")
IMAGE_TYPES = ("application/vnd.oci.image.manifest.v1+json",
               "application/vnd.docker.distribution.manifest.v2+json")
MANIFEST_TYPES = INDEX_TYPES + IMAGE_TYPES
MAX_MANIFEST = 4 << 20
HELPER_TIMEOUT_S = 30  # a helper may ask a keychain; Docker itself waits without limit  # the limit distribution itself applies to manifests


class RegistryAuth(BaseModel):
    """How to reach registries: credentials and which hosts may be plain HTTP."""

    model_config = ConfigDict(extra="forbid")

    username: str | None = Field(None, description="User name (else from the auth files).")
    password: str | None = Field(None, description="Password or token for ``username``.")
    insecure: bool = Field(False, description="Plain HTTP; only to a loopback or private "
                                              "address.")
    auth_file: pathlib.Path | None = Field(
        None, description="Docker config.json or containers auth.json to read credentials "
                          "from; default: $REGISTRY_AUTH_FILE, $DOCKER_CONFIG/config.json, "
                          "~/.docker/config.json")


class RegistryPolicy(BaseModel):
    """A node's policy for images named by a registry reference it does not have yet."""

    model_config = ConfigDict(extra="forbid")

    pull_on_first_use: bool = Field(
        False, description="create(image='host/repo:tag') pulls the image when the store "
                           "lacks it (else such a create answers not found)")
    insecure: list[str] = Field(
        default_factory=list, description="registry hosts ('127.0.0.1:5000') reached over "
                                          "plain HTTP; each must be loopback or private")
    auth_file: pathlib.Path | None = Field(
        None, description="credentials file (Docker config.json format); default: the "
                          "usual places")


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """'Bearer realm="https://x/token",service="x"' -> ('bearer', {'realm': ..., ...})."""
    scheme, _, rest = header.strip().partition(" ")
    params = {k.lower(): v for k, v in re.findall(r'(\w+)="([^"]*)"', rest)}
    return scheme.lower(), params


def _auth_files(explicit: pathlib.Path | None) -> list[pathlib.Path]:
    if explicit is not None:
        return [explicit]
    out = []
    if os.environ.get("REGISTRY_AUTH_FILE"):
        out.append(pathlib.Path(os.environ["REGISTRY_AUTH_FILE"]))
    docker = pathlib.Path(os.environ.get("DOCKER_CONFIG") or pathlib.Path.home() / ".docker")
    out += [docker / "config.json", pathlib.Path(f"/run/containers/{os.getuid()}/auth.json")]
    return out


def load_credentials(registry: str, auth_file: pathlib.Path | None = None
                     ) -> tuple[str, str] | None:
    """(user, password) for ``registry`` from the first auth file that has them.

    In each file, as Docker does: a ``credHelpers`` entry for the registry, else the
    ``credsStore``, names a helper (``docker-credential-NAME get``, :func:`helper_get`);
    when it has nothing for the registry, the file's ``auths`` entry is used."""
    keys = [registry, f"https://{registry}", f"http://{registry}"]
    if registry == DOCKER_HUB:
        keys += ["docker.io", "https://index.docker.io/v1/", "index.docker.io"]
    for path in _auth_files(auth_file):
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as exc:
            raise InvalidArgument(f"cannot read registry credentials from {path}: {exc}") from exc
        if not isinstance(doc, dict):
            raise InvalidArgument(f"cannot read registry credentials from {path}: not an object")
        helpers = doc.get("credHelpers") or {}
        helper = next((helpers[k] for k in keys if k in helpers), None) or doc.get("credsStore")
        if helper:
            server = "https://index.docker.io/v1/" if registry == DOCKER_HUB else registry
            found = helper_get(str(helper), server, path)
            if found is not None:
                return found
        found = _from_auths(doc.get("auths") or {}, keys)
        if found is not None:
            return found
    return None


def _from_auths(auths: dict, keys: list[str]) -> tuple[str, str] | None:
    for key in keys:
        entry = auths.get(key) or auths.get(key.rstrip("/"))
        if not entry:
            continue
        if entry.get("auth"):
            user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
            return user, password
        if entry.get("username"):
            return entry["username"], entry.get("password") or ""
    return None


def helper_get(name: str, server: str, where: pathlib.Path) -> tuple[str, str] | None:
    """Ask the credential helper ``docker-credential-NAME`` for ``server``'s credentials
    (the docker-credential-helpers protocol: ``get``, the server on stdin, JSON with
    ``Username`` and ``Secret`` on stdout). None when it has none for the server."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise InvalidArgument(f"{where} names the credential helper {name!r}; a helper name "
                              f"is letters, digits, '.', '_' or '-'")
    program = shutil.which(f"docker-credential-{name}")
    if program is None:
        raise InvalidArgument(f"{where} names the credential helper {name!r}, but "
                              f"docker-credential-{name} is not on PATH; install it or "
                              f"remove it from the file")
    try:
        res = subprocess.run([program, "get"], input=server, capture_output=True, text=True,
                             timeout=HELPER_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise InvalidArgument(f"credential helper docker-credential-{name} gave no answer "
                              f"for {server} in {HELPER_TIMEOUT_S} s") from exc
    if res.returncode != 0:
        said = (res.stdout.strip() or res.stderr.strip())[:300]
        if "credentials not found" in said.lower():
            return None
        raise InvalidArgument(f"credential helper docker-credential-{name} failed for "
                              f"{server} (exit {res.returncode}): {said}")
    try:
        body = json.loads(res.stdout)
        user, secret = body["Username"], body["Secret"]
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidArgument(f"credential helper docker-credential-{name} answered no "
                              f"Username/Secret JSON for {server}") from exc
    if user == "<token>":
        raise InvalidArgument(f"credential helper docker-credential-{name} holds an identity "
                              f"token for {server}; dsec needs a user name and password or "
                              f"registry token (--username/--password)")
    return str(user), str(secret)


def check_insecure(registry: str) -> None:
    """Refuse plain HTTP unless every address ``registry`` resolves to is loopback/private."""
    host = registry.rsplit(":", 1)[0] if not registry.startswith("[") else registry[1:].split("]")[0]
    try:
        addrs = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError as exc:
        raise InvalidArgument(f"registry {registry}: cannot resolve {host}: {exc}") from exc
    public = [a for a in addrs if not (ipaddress.ip_address(a.split("%")[0]).is_private
                                       or ipaddress.ip_address(a.split("%")[0]).is_loopback)]
    if public:
        raise InvalidArgument(f"--insecure (plain HTTP) is allowed only for registries on "
                              f"loopback or private addresses; {registry} is {public[0]}")


class RegistryClient:
    """One registry host: requests with auth handled, every error a DSecError."""

    def __init__(self, registry: str, auth: RegistryAuth | None = None, *,
                 timeout: float = 60.0, transport: httpx.BaseTransport | None = None) -> None:
        auth = auth or RegistryAuth()
        if auth.insecure:
            check_insecure(registry)
        self.registry = registry
        self.base = ("http://" if auth.insecure else "https://") + registry
        self._given = auth
        self._creds: tuple[str, str] | None | bool = False  # False: not looked up yet
        self.client = httpx.Client(base_url=self.base, timeout=timeout, transport=transport,
                                   follow_redirects=True)
        self._auth: dict[str, str] = {}  # scope -> Authorization header value

    @property
    def creds(self) -> tuple[str, str] | None:
        """(user, password) from the flags or the auth files, looked up at the first 401
        (a credential helper runs only when the registry asks)."""
        if self._creds is False:
            a = self._given
            self._creds = ((a.username, a.password or "") if a.username
                           else load_credentials(self.registry, a.auth_file))
        return self._creds  # type: ignore[return-value]

    def close(self) -> None:
        """Close the connections."""
        self.client.close()

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- requests with auth ------------------------------------------------------------
    @contextlib.contextmanager
    def request(self, method: str, path: str, what: str, *, scope: str,
                ok: tuple[int, ...] = (200,), **kw) -> Iterator[httpx.Response]:
        """Send a request (streamed), answering one auth challenge; yields the response.

        ``what`` names the object for error messages ('manifest of image X').
        ``scope``: 'repository:NAME:pull' (or ':pull,push') for a token.
        """
        for attempt in range(2):
            headers = dict(kw.pop("headers", None) or {})
            if scope in self._auth:
                headers["Authorization"] = self._auth[scope]
            try:
                req = self.client.build_request(method, path, headers=headers, **kw)
                resp = self.client.send(req, stream=True)
            except httpx.HTTPError as exc:
                raise Unavailable(f"registry {self.registry}: {what}: {method} {path} "
                                  f"failed: {exc}") from exc
            kw["headers"] = headers
            try:
                if resp.status_code == 401 and attempt == 0:
                    challenge = resp.headers.get("WWW-Authenticate", "")
                    resp.read()
                    self._authenticate(challenge, scope, what)
                    continue
                if resp.status_code not in ok:
                    self._raise(resp, what)
                yield resp
                return
            finally:
                resp.close()

    def _authenticate(self, challenge: str, scope: str, what: str) -> None:
        scheme, params = parse_challenge(challenge)
        if scheme == "basic":
            if self.creds is None:
                raise InvalidArgument(f"registry {self.registry} wants a user name and "
                                      f"password for {what}; pass --username/--password or "
                                      f"log in with 'podman login {self.registry}'")
            raw = f"{self.creds[0]}:{self.creds[1]}".encode()
            self._auth[scope] = "Basic " + base64.b64encode(raw).decode()
            return
        if scheme != "bearer" or "realm" not in params:
            raise InvalidArgument(f"registry {self.registry} answered 401 for {what} with an "
                                  f"auth challenge dsec does not know: {challenge!r}")
        query = {"scope": params.get("scope") or scope}
        if params.get("service"):
            query["service"] = params["service"]
        basic = httpx.BasicAuth(*self.creds) if self.creds else None
        try:
            r = self.client.get(params["realm"], params=query, auth=basic)
        except httpx.HTTPError as exc:
            raise Unavailable(f"registry {self.registry}: token service {params['realm']} "
                              f"for {what} failed: {exc}") from exc
        if r.status_code in (401, 403):
            raise InvalidArgument(f"registry {self.registry} refused the credentials for "
                                  f"{what} ({r.status_code}); check --username/--password or "
                                  f"the auth file")
        if r.status_code != 200:
            self._raise(r, f"token for {what}")
        try:
            body = r.json()
            token = body.get("token") or body["access_token"]
        except (ValueError, KeyError, AttributeError) as exc:
            raise Unavailable(f"registry {self.registry}: token service answered no token "
                              f"for {what}") from exc
        self._auth[scope] = f"Bearer {token}"

    def _raise(self, resp: httpx.Response, what: str) -> None:
        status = resp.status_code
        try:
            detail = resp.read()[:300].decode("utf-8", "replace").strip()
        except httpx.HTTPError:
            detail = ""
        where = f"registry {self.registry} answered {status} for {what}"
        if status == 404:
            raise NotFound(f"{where}: not found there")
        if status in (401, 403):
            raise InvalidArgument(f"{where}: access denied; pass --username/--password or "
                                  f"log in with 'podman login {self.registry}'")
        if status >= 500 or status == 429:
            raise Unavailable(f"{where}; try again later ({detail})")
        raise InvalidArgument(f"{where}: {detail}")

    # -- manifests -----------------------------------------------------------------------
    def manifest(self, repo: str, ref: str, what: str) -> tuple[str, bytes, str]:
        """(media type, bytes, digest) of a manifest or index, its digest verified."""
        accept = ", ".join(MANIFEST_TYPES)
        with self.request("GET", f"/v2/{repo}/manifests/{ref}", what,
                          scope=f"repository:{repo}:pull", headers={"Accept": accept}) as r:
            data = _read_bounded(r, MAX_MANIFEST, what)
            claimed = r.headers.get("Docker-Content-Digest")
            media = r.headers.get("Content-Type", "").split(";")[0].strip()
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        want = ref if is_digest(ref) else claimed
        if want is not None and want.startswith("sha256:") and want != digest:
            raise InvalidArgument(f"{what} from registry {self.registry} hashes to {digest}, "
                                  f"not {want}: the manifest is corrupted; refusing it")
        try:
            media = json.loads(data).get("mediaType") or media
        except (ValueError, AttributeError) as exc:
            raise InvalidArgument(f"{what} from registry {self.registry} is not JSON") from exc
        return media, data, digest

    def put_manifest(self, repo: str, ref: str, media_type: str, data: bytes,
                     what: str) -> str:
        """Upload a manifest under tag or digest ``ref``; returns its digest."""
        with self.request("PUT", f"/v2/{repo}/manifests/{ref}", what,
                          scope=f"repository:{repo}:pull,push", ok=(200, 201),
                          content=data, headers={"Content-Type": media_type}):
            pass
        return "sha256:" + hashlib.sha256(data).hexdigest()

    # -- blobs -------------------------------------------------------------------------
    @contextlib.contextmanager
    def blob(self, repo: str, digest: str, what: str,
             byte_range: tuple[int, int] | None = None) -> Iterator[httpx.Response]:
        """Stream a blob (or bytes ``start..end`` inclusive of it); the caller verifies."""
        headers = {"Range": f"bytes={byte_range[0]}-{byte_range[1]}"} if byte_range else {}
        with self.request("GET", f"/v2/{repo}/blobs/{digest}", what, headers=headers,
                          scope=f"repository:{repo}:pull",
                          ok=(206,) if byte_range else (200,)) as r:
            yield r

    def blob_bytes(self, repo: str, digest: str, limit: int, what: str) -> bytes:
        """A small blob (a config), read whole and checked against ``digest``."""
        with self.blob(repo, digest, what) as r:
            data = _read_bounded(r, limit, what)
        got = "sha256:" + hashlib.sha256(data).hexdigest()
        if got != digest:
            raise InvalidArgument(f"{what} from registry {self.registry} hashes to {got}, "
                                  f"not {digest}: corrupted; refusing it")
        return data

    def has_blob(self, repo: str, digest: str, what: str) -> bool:
        """True if the repository holds the blob."""
        with self.request("HEAD", f"/v2/{repo}/blobs/{digest}", what,
                          scope=f"repository:{repo}:pull,push", ok=(200, 404)) as r:
            return r.status_code == 200

    def push_blob(self, repo: str, digest: str, path: pathlib.Path, what: str) -> None:
        """Upload a file as a blob (monolithic: POST for a session, then one PUT)."""
        scope = f"repository:{repo}:pull,push"
        with self.request("POST", f"/v2/{repo}/blobs/uploads/", what, scope=scope,
                          ok=(202,)) as r:
            location = r.headers.get("Location")
        if not location:
            raise Unavailable(f"registry {self.registry} gave no upload location for {what}")
        sep = "&" if "?" in location else "?"
        size = path.stat().st_size
        with open(path, "rb") as f:
            with self.request("PUT", f"{location}{sep}digest={digest}", what, scope=scope,
                              ok=(201,), content=iter(lambda: f.read(1 << 20), b""),
                              headers={"Content-Type": "application/octet-stream",
                                       "Content-Length": str(size)}):
                pass


def _read_bounded(resp: httpx.Response, limit: int, what: str) -> bytes:
    out = bytearray()
    try:
        for block in resp.iter_bytes(1 << 16):
            out += block
            if len(out) > limit:
                raise InvalidArgument(f"{what} is larger than {limit} bytes; refusing it")
    except httpx.HTTPError as exc:
        raise Unavailable(f"{what}: the connection broke while reading: {exc}") from exc
    return bytes(out)

