"""Overwriting a system binary changes only that sandbox's writable layer."""

HACK = "rm /bin/sh && printf '#!/bin/busybox ash\\necho HACKED\\n' > /bin/sh && chmod +x /bin/sh"


async def test_replacing_bin_sh_stays_in_its_sandbox(client):
    a = await client.create(memory_mb=128)
    b = await client.create(memory_mb=128)
    try:
        assert (await a.exec(HACK)).exit_code == 0
        assert (await a.exec(["/bin/sh", "-c", "echo ok"])).stdout == "HACKED\n"
        assert (await b.exec(["/bin/sh", "-c", "echo ok"])).stdout == "ok\n"
        c = await client.create(memory_mb=128)  # a new sandbox from the same shared layer
        try:
            assert (await c.exec(["/bin/sh", "-c", "echo ok"])).stdout == "ok\n"
        finally:
            await c.stop()
    finally:
        await a.stop()
        await b.stop()


async def test_destroying_busybox_breaks_only_its_sandbox(client):
    a = await client.create(memory_mb=128)
    b = await client.create(memory_mb=128)
    try:
        await a.exec(["/bin/busybox", "cp", "/bin/busybox", "/tmp/busybox"])
        wreck = "rm /bin/busybox && echo junk > /bin/busybox && chmod +x /bin/busybox"
        assert (await a.exec(["/tmp/busybox", "sh", "-c", wreck])).exit_code == 0
        assert (await a.exec(["/bin/busybox", "true"])).exit_code != 0
        assert (await b.exec(["/bin/busybox", "echo", "fine"])).stdout == "fine\n"
    finally:
        await a.stop()
        await b.stop()
