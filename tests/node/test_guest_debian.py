"""The Debian image (python3, git, gcc; `make images`) in guests: on microvm its layers are
the same EROFS files a container uses; on vm it becomes a bootable disk with its own kernel
and init. TCG on this machine."""

import asyncio

import pytest

import dsec
from tests.support.images import ensure_debian_image
from tests.support.server import ServerProcess, leftovers

pytestmark = pytest.mark.timeout(900)

PROGRAM = "import sys, platform; print(sys.version_info[:2], platform.release())"


@pytest.fixture(scope="module")
def guest_server():
    srv = ServerProcess(backends=["container", "microvm", "vm"]).start()
    ensure_debian_image(srv.state_dir)
    yield srv
    srv.stop_all_sandboxes()
    left = leftovers(srv.state_dir)
    srv.destroy()
    assert not left, left


@pytest.mark.parametrize("backend", ["microvm", "vm"])
async def test_python_and_git_work_in_a_debian_guest(guest_server, backend):
    srv = guest_server
    async with dsec.AsyncClient(srv.url, srv.token, timeout=600) as c:
        ctr = await c.create(image="python:3.11", memory_mb=256)
        sb = await c.create(backend=backend, image="python:3.11", memory_mb=768, disk_mb=2048)
        try:
            assert (await sb.exec("cat /etc/debian_version")).stdout.startswith("12.")
            await sb.files.write("/work/prog.py", PROGRAM)
            guest = await sb.exec(["python3", "/work/prog.py"], timeout=120)
            host = await ctr.exec(["python3", "-c", PROGRAM], timeout=60)
            assert guest.exit_code == 0, guest.stderr
            # Same Python from the same layers; a kernel of its own (not the host's).
            assert guest.stdout.split(")")[0] == host.stdout.split(")")[0]
            assert guest.stdout.split()[-1] != host.stdout.split()[-1]
            r = await sb.exec("cd /work && git init -q && git add . && git -c user.email=a@b "
                              "-c user.name=dsec commit -qm init && git log --oneline | wc -l",
                              timeout=120)
            assert (r.exit_code, r.stdout.strip()) == (0, "1"), r.stderr
            r = await sb.exec("printf 'int main(){return 7;}' > /work/t.c && "
                              "gcc -o /work/t /work/t.c && /work/t", timeout=300)
            assert r.exit_code == 7, r.stderr
        finally:
            await asyncio.gather(sb.stop(), ctr.stop())
