"""Protected paths: no command in the sandbox, root included, reads or writes them; the
grading step does.

Each attack runs as an ordinary exec (root, the container's capability set) and must be
refused; afterwards a grading exec checks the protected files are exactly as written, so a
test whose attack worked fails on the content even if the command's exit status lied.
"""

import asyncio

import pytest

import dsec
from dsec.rl import AsyncToolAdapter

SECRET = b"expected-answer-42\n"
HIDDEN = b"#!/bin/sh\necho hidden test\n"
PROTECTED = ["/grader", "/repo/tests/hidden.sh"]


@pytest.fixture
async def guarded(client):
    sb = await client.create(memory_mb=128, protected_paths=PROTECTED)
    try:
        # the owner's files API and a grading exec put the hidden files in place
        await sb.files.mkdir("/repo")
        await sb.files.write("/grader/secret.txt", SECRET)
        await sb.files.write("/repo/calc.sh", b"echo 3\n")
        r = await sb.exec("mkdir -p /repo/tests && cat > /repo/tests/hidden.sh", grading=True,
                          stdin=HIDDEN)
        assert r.exit_code == 0, r
        yield sb
    finally:
        await sb.stop()


async def intact(sb) -> None:
    r = await sb.exec("cat /grader/secret.txt /repo/tests/hidden.sh; ls -a /grader",
                      grading=True)
    assert r.exit_code == 0, r
    assert r.stdout == (SECRET + HIDDEN).decode() + ".\n..\nsecret.txt\n", r.stdout


async def refused(sb, cmd: str) -> None:
    r = await sb.exec(cmd)
    assert r.exit_code != 0, (cmd, r)
    assert SECRET.decode().strip() not in r.stdout + r.stderr, (cmd, r)
    assert "hidden test" not in r.stdout + r.stderr, (cmd, r)


async def test_the_spec_names_them(guarded):
    assert (await guarded.refresh()).protected_paths == PROTECTED


@pytest.mark.parametrize("cmd", [
    "cat /grader/secret.txt",
    "head -c 100 /grader/secret.txt",
    "dd if=/grader/secret.txt bs=1 count=100",
    "cat /repo/tests/hidden.sh",
    "ls /grader",
    "cd /grader && cat secret.txt",
    "cat < /grader/secret.txt",
    "grep -r expected-answer /grader",
])
async def test_reading_is_refused(guarded, cmd):
    await refused(guarded, cmd)
    await intact(guarded)


async def test_the_rest_of_the_sandbox_works(guarded):
    r = await guarded.exec("sh /repo/calc.sh && echo x > /tmp/t && cat /tmp/t && "
                           "mkdir -p /tmp/d/e && rm -r /tmp/d && ls /bin | grep -c . >/dev/null")
    assert (r.exit_code, r.stdout) == (0, "3\nx\n"), r
    # a directory on the way to a protected path can be walked through, not listed
    assert (await guarded.exec("ls /")).exit_code != 0
    assert (await guarded.exec("cd / && cat etc/passwd >/dev/null")).exit_code == 0


@pytest.mark.parametrize("cmd", [
    "echo forged > /grader/secret.txt",
    "echo forged >> /grader/secret.txt",
    "echo forged > /grader/new.txt",
    "mkdir /grader/sub",
    "rm /grader/secret.txt",
    "rm -rf /grader",
    "truncate -s 0 /grader/secret.txt",
    "echo 'echo PASS' > /repo/tests/hidden.sh",
    "rm /repo/tests/hidden.sh",
    "mkfifo /grader/f",
])
async def test_writing_is_refused(guarded, cmd):
    await refused(guarded, cmd)
    await intact(guarded)


@pytest.mark.parametrize("cmd", [
    "mv /grader /g2",
    "mv /grader/secret.txt /tmp/s",
    "echo forged > /tmp/s && mv /tmp/s /grader/secret.txt",
    "mv /repo /r2",                      # an ancestor of a protected file
    "mv /repo/tests /tmp/t",
    "echo 'echo PASS' > /tmp/h && mv /tmp/h /repo/tests/hidden.sh",
])
async def test_renaming_is_refused(guarded, cmd):
    await refused(guarded, cmd)
    await intact(guarded)


@pytest.mark.parametrize("cmd", [
    "ln /grader/secret.txt /tmp/hard && cat /tmp/hard",
    "ln -s /grader/secret.txt /tmp/soft && cat /tmp/soft",
    "ln -s /grader /tmp/dir && cat /tmp/dir/secret.txt",
    "ln -s ../grader/secret.txt /repo/s && cat /repo/s",
    "echo forged > /tmp/f && ln /tmp/f /grader/f",
    "ln -s /tmp/x /grader/link",
])
async def test_linking_is_refused(guarded, cmd):
    await refused(guarded, cmd)
    await intact(guarded)


@pytest.mark.parametrize("cmd", [
    "cat /proc/self/root/grader/secret.txt",
    "cat /proc/1/root/grader/secret.txt",
    "cat /proc/$$/cwd/../grader/secret.txt",
    "cd /proc/self/root/grader && cat secret.txt",
    "echo forged > /proc/self/root/grader/secret.txt",
])
async def test_proc_root_tricks_are_refused(guarded, cmd):
    await refused(guarded, cmd)
    await intact(guarded)


async def test_a_grading_process_cannot_be_entered_through_proc(guarded):
    """A grading command holds /grader as its cwd and an open file there: neither its
    /proc cwd, root, fd nor environ lead a sandboxed command to the secret (Landlock
    refuses /proc/<pid> access to a process outside the command's domain)."""
    r = await guarded.exec("cd /grader && exec 3</grader/secret.txt && exec sleep 60",
                           grading=True, background=True, env={"TOKEN": "expected-answer-42"})
    pid = r.pid
    try:
        for cmd in (f"cat /proc/{pid}/cwd/secret.txt", f"cat /proc/{pid}/fd/3",
                    f"cat /proc/{pid}/root/grader/secret.txt", f"cat /proc/{pid}/environ"):
            await refused(guarded, cmd)
    finally:
        await guarded.exec(f"kill {pid}", grading=True)
    await intact(guarded)


@pytest.mark.parametrize("cmd", [
    "chroot / cat /grader/secret.txt",
    "mkdir -p /tmp/b && mount --bind /grader /tmp/b && cat /tmp/b/secret.txt",
    "mkdir -p /tmp/b && mount -t tmpfs x /grader",
    "unshare -m sh -c 'mount --bind /grader /tmp && cat /tmp/secret.txt'",
])
async def test_chroot_and_mounts_are_refused(guarded, cmd):
    await refused(guarded, cmd)
    await intact(guarded)


async def test_a_shell_session_is_confined_too(guarded):
    sh = await guarded.shell()
    r = await sh.run("cat /grader/secret.txt; echo rc=$?")
    assert "rc=1" in r.stdout and SECRET.decode().strip() not in r.stdout, r


async def test_a_command_started_before_the_grader_wrote_cannot_read_later(guarded):
    """A background command that outlives its exec stays confined: files the grading step
    makes afterwards are out of its reach too."""
    await guarded.exec("while true; do cat /grader/late.txt >> /tmp/leak 2>/dev/null; "
                       "sleep 0.2; done", background=True)
    await guarded.exec("echo late-secret > /grader/late.txt", grading=True)
    await asyncio.sleep(1.0)
    r = await guarded.exec("cat /tmp/leak")
    assert "late-secret" not in r.stdout, r


async def test_the_models_file_tools_are_confined(guarded):
    tools = AsyncToolAdapter(guarded)
    out = await tools({"name": "read_file", "arguments": {"path": "/grader/secret.txt"}})
    assert out.startswith("[error]") and "expected-answer" not in out, out
    out = await tools({"name": "write_file",
                       "arguments": {"path": "/grader/secret.txt", "content": "forged"}})
    assert out.startswith("[error]"), out
    assert (await tools({"name": "read_file", "arguments": {"path": "/repo/calc.sh"}})) == "echo 3\n"
    await intact(guarded)


async def test_grading_reads_and_writes_them(guarded):
    r = await guarded.exec("cat /grader/secret.txt && sh /repo/tests/hidden.sh && "
                           "echo verdict > /grader/result", grading=True)
    assert (r.exit_code, r.stdout) == (0, SECRET.decode() + "hidden test\n"), r
    r = await guarded.exec(["cat", "/grader/result"], grading=True)
    assert r.stdout == "verdict\n"
    assert (await guarded.exec("cat /grader/result")).exit_code != 0


@pytest.mark.parametrize("cmd", [
    "mkdir -p /srv && ln /grader/secret.txt /srv/h",          # out of a protected dir
    "ln /grader/secret.txt /tmp/h",
    "ln /repo/tests/hidden.sh /repo/h",                        # a protected file, elsewhere
    "echo mine > /tmp/m && ln /tmp/m /grader/m",               # into one
])
async def test_the_grading_step_cannot_link_across_directories(guarded, cmd):
    """Another name outside the protected paths would give agent commands the file."""
    r = await guarded.exec(cmd, grading=True)
    for name in ("/srv/h", "/tmp/h", "/repo/h"):
        await refused(guarded, f"cat {name}")
    assert r.exit_code != 0 and "cross-device" in r.stderr, (cmd, r)
    r = await guarded.exec("ls /grader; mv /grader/secret.txt /grader/s2 && "
                           "mv /grader/s2 /grader/secret.txt", grading=True)
    assert r.stdout == "secret.txt\n" and r.exit_code == 0, r  # renames inside still work
    await intact(guarded)


async def test_a_link_the_grading_step_makes_beside_a_protected_file_is_protected(guarded):
    """The same directory needs no Landlock REFER right: the agent's ruleset leaves an
    entry with a protected file's inode out instead."""
    r = await guarded.exec("ln /repo/tests/hidden.sh /repo/tests/h2 && "
                           "ln /grader/secret.txt /grader/copy", grading=True)
    assert r.exit_code == 0, r
    for cmd in ("cat /repo/tests/h2", "cp /repo/tests/h2 /tmp/x && cat /tmp/x",
                "cat /grader/copy", "sh /repo/tests/h2"):
        await refused(guarded, cmd)
    assert (await guarded.exec("cat /repo/calc.sh")).stdout == "echo 3\n"  # its neighbour
    r = await guarded.exec("cat /repo/tests/h2 && rm /repo/tests/h2 /grader/copy",
                           grading=True)
    assert r.stdout == HIDDEN.decode(), r
    await intact(guarded)


@pytest.mark.parametrize("paths,needle", [
    (["grader"], "absolute"),
    (["/"], "'/'"),
    (["/a/../grader"], "'..'"),
    (["/proc/self"], "/proc"),
])
async def test_bad_protected_paths_are_refused_with_what_to_change(client, paths, needle):
    with pytest.raises(dsec.InvalidArgument) as err:
        await client.create(protected_paths=paths)
    assert needle in str(err.value)
