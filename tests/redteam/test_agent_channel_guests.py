"""The agent inside microvm and vm guests is out of reach of its commands, as in containers.

A guest's commands would be root with every capability of the guest kernel; the agent
confines each one (the container capability set, no_new_privs, the seccomp allowlist) and
is the init of their pid namespace. Real QEMU guests (TCG here, so one guest per backend).
"""

from __future__ import annotations

import secrets

import pytest

import dsec
from dsec.node.host.oci import CAPABILITIES
from tests.redteam.probes import build_probe
from tests.redteam.test_agent_channel import PROBE, _attempts

pytestmark = pytest.mark.timeout(600)

CAP_BITS = {"CAP_CHOWN": 0, "CAP_DAC_OVERRIDE": 1, "CAP_FOWNER": 3, "CAP_FSETID": 4,
            "CAP_KILL": 5, "CAP_SETGID": 6, "CAP_SETUID": 7, "CAP_SETPCAP": 8,
            "CAP_NET_BIND_SERVICE": 10, "CAP_SYS_CHROOT": 18, "CAP_AUDIT_WRITE": 29,
            "CAP_SETFCAP": 31}
CONTAINER_CAPS = f"{sum(1 << CAP_BITS[c] for c in CAPABILITIES):016x}"


@pytest.fixture
async def client(guest_server):
    async with dsec.AsyncClient(guest_server.url, guest_server.token, timeout=300) as c:
        yield c


@pytest.mark.parametrize("backend", ["microvm", "vm"])
async def test_guest_agent_cannot_be_read_traced_robbed_or_killed(client, backend):
    sb = await client.create(backend=backend, memory_mb=256)
    try:
        await sb.files.write(PROBE, build_probe("agent_attack").read_bytes())
        assert (await sb.exec(["chmod", "755", PROBE])).exit_code == 0
        for what in ("mem", "getfd", "ptrace", "vmread"):
            r = await sb.exec([PROBE, what], timeout=30)
            tried = dict(_attempts(r.stdout, what))
            assert 1 in tried and "ok" not in tried.values(), (backend, what, r)
        r = await sb.exec([PROBE, "forge", "20"], timeout=30)
        assert "steal - no-listener" in r.stdout, r
        r = await sb.exec([PROBE, "signal"], timeout=30)
        assert any(pid == 1 for pid, _ in _attempts(r.stdout, "kill")), r
        token = f"genuine-{secrets.token_hex(4)}"
        r = await sb.exec(f"echo {token}", timeout=30)
        assert (r.exit_code, r.stdout) == (0, f"{token}\n"), r
        # the commands' confinement itself: no user namespaces, no module loading
        r = await sb.exec("unshare -U true; echo rc=$?; grep CapBnd /proc/self/status",
                          timeout=30)
        assert "rc=0" not in r.stdout and f"CapBnd:\t{CONTAINER_CAPS}" in r.stdout, r
    finally:
        await sb.stop()
