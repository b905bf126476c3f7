"""Registry credentials from Docker's credential helpers (credHelpers, credsStore).

The registry is real (docker-registry on loopback with an htpasswd file). The helper is a
small fake: a shell script named docker-credential-dsectest on PATH, because the real
helpers (pass, secretservice, osxkeychain) need a keychain this machine does not have. It
speaks the docker-credential-helpers protocol as they do: ``get``, the server on stdin,
JSON on stdout, "credentials not found" and exit 1 for an unknown server.
"""

from __future__ import annotations

import json
import os
import stat

import pytest

from dsec.api.errors import InvalidArgument
from dsec.images.registry import RegistryAuth
from tests.support.registry import run_registry

HELPER = """#!/bin/sh
read server
echo "$1 $server" >> "{log}"
if [ "$server" = "{host}" ]; then
  printf '{{"ServerURL": "%s", "Username": "alice", "Secret": "pw-alice"}}\\n' "$server"
else
  echo "credentials not found in native keychain"; exit 1
fi
"""


@pytest.fixture
def authreg(svc, busybox, tmp_path):
    """A registry wanting Basic auth (alice / pw-alice), holding busybox as team/bb:1."""
    with run_registry(tmp_path / "reg", users={"alice": "pw-alice"}) as reg:
        svc.push_registry("busybox", reg.ref("team/bb:1"),
                          RegistryAuth(insecure=True, username="alice", password="pw-alice"))
        yield reg


@pytest.fixture
def helper(tmp_path, monkeypatch):
    """Install docker-credential-dsectest on PATH; returns a writer for its known host and
    the file it logs each call to."""
    bindir, log = tmp_path / "bin", tmp_path / "helper.log"
    bindir.mkdir()
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")

    def install(host: str):
        script = bindir / "docker-credential-dsectest"
        script.write_text(HELPER.format(log=log, host=host))
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
        return log
    return install


def _config(tmp_path, doc) -> RegistryAuth:
    path = tmp_path / "docker" / "config.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(doc))
    return RegistryAuth(insecure=True, auth_file=path)


def test_cred_helpers_entry_is_asked_as_docker_does(svc, authreg, helper, tmp_path):
    log = helper(authreg.host)
    auth = _config(tmp_path, {"credHelpers": {authreg.host: "dsectest"}})
    info = svc.pull_registry(authreg.ref("team/bb:1"), tag="pulled/bb:1", auth=auth)
    assert info.layers == len(svc.manifest("busybox").layers)
    assert log.read_text().splitlines()[0] == f"get {authreg.host}"


def test_creds_store_from_docker_config_dir(svc, authreg, helper, tmp_path, monkeypatch):
    helper(authreg.host)
    (tmp_path / "dc").mkdir()
    (tmp_path / "dc" / "config.json").write_text(json.dumps(
        {"auths": {authreg.host: {}}, "credsStore": "dsectest"}))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "dc"))
    monkeypatch.delenv("REGISTRY_AUTH_FILE", raising=False)
    info = svc.pull_registry(authreg.ref("team/bb:1"), tag="pulled/bb:1",
                             auth=RegistryAuth(insecure=True))
    assert info.name == "pulled/bb:1"


def test_helper_without_credentials_for_the_host_is_a_401_error(svc, authreg, helper,
                                                                tmp_path):
    log = helper("other.example:5000")
    auth = _config(tmp_path, {"credsStore": "dsectest"})
    with pytest.raises(InvalidArgument, match="wants a user name and password"):
        svc.pull_registry(authreg.ref("team/bb:1"), tag="pulled/bb:1", auth=auth)
    assert log.read_text().split() == ["get", authreg.host]
    assert svc.store.get_tag("pulled/bb:1") is None


def test_missing_helper_is_named(svc, authreg, tmp_path):
    auth = _config(tmp_path, {"credHelpers": {authreg.host: "nosuchhelper"}})
    with pytest.raises(InvalidArgument, match="docker-credential-nosuchhelper is not on PATH"):
        svc.pull_registry(authreg.ref("team/bb:1"), tag="pulled/bb:1", auth=auth)


def test_helper_runs_only_when_the_registry_asks(svc, busybox, tmp_path):
    with run_registry(tmp_path / "open") as reg:
        svc.push_registry("busybox", reg.ref("team/bb:1"), RegistryAuth(insecure=True))
        auth = _config(tmp_path, {"credsStore": "nosuchhelper"})
        assert svc.pull_registry(reg.ref("team/bb:1"), tag="pulled/bb:1", auth=auth).layers
