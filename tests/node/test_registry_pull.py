"""create(image='127.0.0.1:PORT/repo:tag') pulls the image from a real registry on first use."""

from __future__ import annotations

import pytest

import dsec
from tests.images.tarutil import d, entry, make_tar
from tests.support.registry import make_layout, run_registry, skopeo_copy
from tests.support.server import ServerProcess, leftovers


def _busybox_layer() -> bytes:
    with open("/bin/busybox", "rb") as f:
        bb = f.read()
    return make_tar([d("bin"), entry("bin/busybox", bb, mode=0o755),
                     entry("bin/sh", type=b"2", linkname="busybox"),
                     entry("bin/cat", type=b"2", linkname="busybox"),
                     d("srv"), entry("srv/hello", b"from the registry\n")])


@pytest.fixture
def registry(tmp_path):
    with run_registry(tmp_path) as reg:
        make_layout(tmp_path / "layout", [_busybox_layer()], env={"FROM": "registry"})
        skopeo_copy(tmp_path / "layout", reg.ref("team/env:v3"))
        yield reg


@pytest.mark.parametrize("allowed", [True, False])
async def test_create_pulls_on_first_use_when_the_node_allows(registry, allowed):
    args = ["--insecure-registry", registry.host] + (["--registry-pull"] if allowed else [])
    srv = ServerProcess(extra_args=args).start()
    try:
        async with dsec.AsyncClient(srv.url, srv.token) as c:
            ref = registry.ref("team/env:v3")
            if not allowed:
                with pytest.raises(dsec.NotFound, match="team/env:v3"):
                    await c.create(image=ref, memory_mb=64)
                return
            sb = await c.create(image=ref, memory_mb=64)
            try:
                r = await sb.exec("cat /srv/hello; echo $FROM")
                assert r.stdout == "from the registry\nregistry\n"
            finally:
                await sb.stop()
    finally:
        srv.destroy()
    assert leftovers(srv.state_dir) == []
