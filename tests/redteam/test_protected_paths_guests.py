"""Protected paths in microvm and vm guests: the agent applies Landlock in the guest's own
kernel (Debian's 6.1 here: Landlock ABI 2, which does not check truncate(2), so the agent
refuses that call with seccomp too). The grading step cannot give a protected file
another name across directories, and one it gives beside a protected file is as protected.
Real QEMU guests (TCG here)."""

from __future__ import annotations

import pytest

import dsec

pytestmark = pytest.mark.timeout(600)

SECRET = "expected-answer-42"
ATTACKS = ["cat /grader/secret.txt", "ls /grader", "echo forged > /grader/secret.txt",
           "truncate -s 0 /grader/secret.txt", "mv /grader /g2",
           "ln /grader/secret.txt /tmp/h && cat /tmp/h",
           "ln -s /grader/secret.txt /tmp/s && cat /tmp/s",
           "cat /proc/self/root/grader/secret.txt", "chroot / cat /grader/secret.txt"]


# the grading step's hard links: across directories refused, beside a protected file kept
# out of agent commands' reach (agent/protect.h)
GRADING_LINKS = "ln /grader/secret.txt /tmp/gl; ln /repo/hidden.sh /tmp/gh; " \
                "ln /repo/hidden.sh /repo/h2"
LINK_ATTACKS = ["cat /tmp/gl", "cat /tmp/gh", "cat /repo/h2", "cp /repo/h2 /tmp/c && cat /tmp/c"]


@pytest.mark.parametrize("backend", ["microvm", "vm"])
async def test_guest_commands_cannot_reach_protected_paths(guest_server, backend):
    async with dsec.AsyncClient(guest_server.url, guest_server.token, timeout=300) as c:
        sb = await c.create(backend=backend, memory_mb=256,
                            protected_paths=["/grader", "/repo/hidden.sh"])
        try:
            r = await sb.exec(f"mkdir -p /grader /repo && echo {SECRET} > /grader/secret.txt "
                              f"&& echo {SECRET} > /repo/hidden.sh", grading=True, timeout=60)
            assert r.exit_code == 0, r
            r = await sb.exec(GRADING_LINKS, grading=True, timeout=60)
            assert r.stderr.count("cross-device") == 2, (backend, r)
            for cmd in ATTACKS + LINK_ATTACKS:
                r = await sb.exec(cmd, timeout=60)
                assert r.exit_code != 0 and SECRET not in r.stdout, (backend, cmd, r)
            r = await sb.exec("cat /grader/secret.txt; ls /grader", grading=True, timeout=60)
            assert r.stdout == f"{SECRET}\nsecret.txt\n", (backend, r)
            assert (await sb.exec("echo ok > /tmp/x && cat /tmp/x")).stdout == "ok\n"
            if backend == "vm":  # its display's keyboard reaches tty1's shell, unconfined
                with pytest.raises(dsec.Forbidden, match="console shell"):
                    await sb.input.type("cat /grader/secret.txt > /tmp/typed\n")
        finally:
            await sb.stop()
