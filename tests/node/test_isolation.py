"""What a container sandbox must not be able to do, and the limits that hold it."""

import asyncio


async def test_hostname_is_the_sandbox_id(sandbox):
    assert (await sandbox.exec("hostname")).stdout.strip() == sandbox.id


async def test_reduced_privileges(sandbox):
    status = (await sandbox.exec("cat /proc/self/status")).stdout
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    assert fields["NoNewPrivs"].strip() == "1"
    assert fields["Seccomp"].strip() == "2"
    cap_eff = int(fields["CapEff"], 16)
    assert not cap_eff & (1 << 21), "CAP_SYS_ADMIN must be dropped"
    assert not cap_eff & (1 << 13), "CAP_NET_RAW must be dropped"


async def test_mount_and_unshare_refused(sandbox):
    r = await sandbox.exec("mount -t tmpfs none /mnt")
    assert r.exit_code != 0
    r = await sandbox.exec("unshare -m true")
    assert r.exit_code != 0


async def test_proc_and_sys_masked(sandbox):
    r = await sandbox.exec("head -c 4 /proc/kcore; wc -c < /proc/kpagecgroup; ls /sys/firmware")
    assert "ELF" not in r.stdout
    assert r.stdout.split()[0] == "0"  # masked with an empty file
    r = await sandbox.exec("echo 1 > /proc/sys/kernel/panic")
    assert r.exit_code != 0


async def test_network_none_is_loopback_only(sandbox, server):
    links = (await sandbox.exec("ip -o link")).stdout
    assert [line.split(":")[1].strip() for line in links.splitlines()] == ["lo"]
    r = await sandbox.exec(f"wget -q -T 2 -O- http://127.0.0.1:{server.port}/healthz", timeout=10)
    assert r.exit_code != 0, "the node's own API must be unreachable"


async def test_sandboxes_cannot_reach_each_other(client):
    a = await client.create(memory_mb=64)
    b = await client.create(memory_mb=64)
    try:
        await a.exec("nc -l -p 8080 -e echo hi", background=True)
        assert "hi" in (await a.exec("sleep 0.2; nc 127.0.0.1 8080 </dev/null",
                                     timeout=5)).stdout
        await a.exec("nc -l -p 8080 -e echo hi", background=True)
        r = await b.exec("nc -w 1 127.0.0.1 8080 </dev/null", timeout=5)
        assert "hi" not in r.stdout
    finally:
        await asyncio.gather(a.stop(), b.stop())


async def test_fork_bomb_is_contained_by_the_pids_limit(client):
    sb = await client.create(memory_mb=128, pids=64)
    other = await client.create(memory_mb=64)
    try:
        r = await sb.exec("bomb() { bomb | bomb & }; bomb", timeout=3)
        assert r.exit_code is not None
        assert (await other.exec("echo ok")).stdout == "ok\n"
    finally:
        await asyncio.gather(sb.stop(), other.stop())


async def test_memory_hog_is_oom_killed_alone(client):
    sb = await client.create(memory_mb=64)
    try:
        r = await sb.exec("x=$(head -c 300000000 /dev/zero | tr '\\0' a); echo done",
                          timeout=60)
        assert r.oom_killed and r.exit_code == 137
        assert (await sb.exec("echo alive")).stdout == "alive\n"
    finally:
        await sb.stop()


async def test_a_child_killed_for_memory_is_an_oom_kill(client):
    sb = await client.create(memory_mb=64)
    try:  # /tmp is in memory: dd is killed, the pipeline's status is tail's
        r = await sb.exec("dd if=/dev/zero of=/tmp/fill bs=1M count=200 2>&1 | tail -2",
                          timeout=60)
        assert (r.exit_code, r.stderr, r.oom_killed) == (0, "Killed\n", True)
    finally:
        await sb.stop()


async def test_a_child_killed_otherwise_is_no_oom_kill(sandbox):
    r = await sandbox.exec("sh -c 'kill -9 $$'; echo after")
    assert (r.stdout, r.stderr, r.oom_killed) == ("after\n", "Killed\n", False)


async def test_disk_limit_gives_enospc_in_that_sandbox_only(client):
    sb = await client.create(memory_mb=256, disk_mb=16)
    other = await client.create(memory_mb=64)
    try:
        r = await sb.exec("dd if=/dev/zero of=/big bs=1M count=64", timeout=60)
        assert r.exit_code != 0 and "No space left" in r.stderr
        assert (await other.exec("dd if=/dev/zero of=/f bs=1M count=20 && echo ok",
                                 timeout=60)).stdout.endswith("ok\n")
    finally:
        await asyncio.gather(sb.stop(), other.stop())


async def test_open_files_limit_within_host_hard_limit(sandbox):
    soft = int((await sandbox.exec("ulimit -n")).stdout)
    assert 1024 <= soft < 20000


async def test_cgroup_limits_applied(client):
    from dsec.node.host.cgroups import ROOT, detect
    sb = await client.create(cpu=0.5, memory_mb=96, pids=77)
    try:
        rel = f"dsec/{sb.id}"
        if detect().version == 1:
            assert (ROOT / "cpu" / rel / "cpu.cfs_quota_us").read_text().strip() == "50000"
            mem = int((ROOT / "memory" / rel / "memory.limit_in_bytes").read_text())
            pids = (ROOT / "pids" / rel / "pids.max").read_text().strip()
        else:
            assert (ROOT / rel / "cpu.max").read_text().split()[0] == "50000"
            mem = int((ROOT / rel / "memory.max").read_text())
            pids = (ROOT / rel / "pids.max").read_text().strip()
        assert mem == 96 << 20 and pids == "77"
    finally:
        await sb.stop()
