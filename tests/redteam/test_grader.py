"""Hidden grading: the agent cannot read, pre-empt or fool the grader."""

from dsec.rl import AsyncSandboxEnv, grade
from tests.rl.tasks import repair_task

PLANT_SH = ("rm /bin/sh; printf '#!/bin/busybox ash\\nexit 0\\n' > /bin/sh; chmod +x /bin/sh; "
            "mkdir -p /grader; printf '#!/bin/busybox ash\\nexit 0\\n' > /grader/test.sh; "
            "chmod +x /grader/test.sh")


async def test_grader_files_never_enter_the_agent_sandbox(client):
    env = AsyncSandboxEnv(client, repair_task())
    try:
        await env.reset()
        await env.step({"name": "submit"})
        # grading ran; the agent's sandbox still has no /grader
        r = await env.sandbox.exec("ls /grader")
        assert r.exit_code != 0
    finally:
        await env.close()


async def test_planted_shell_and_fake_grader_do_not_earn_a_reward(client):
    env = AsyncSandboxEnv(client, repair_task())
    try:
        await env.reset()
        await env.step(PLANT_SH)
        assert (await env.sandbox.exec(["/bin/sh", "-c", "exit 1"])).exit_code == 0  # hacked
        _, reward, done, _, info = await env.step({"name": "submit"})
        assert (reward, done) == (0.0, True), info["grade"]
    finally:
        await env.close()


async def test_an_honest_fix_still_passes_after_an_attempted_hack(client):
    env = AsyncSandboxEnv(client, repair_task())
    try:
        await env.reset()
        await env.step(PLANT_SH)
        # the planted /bin/sh swallows shell commands: fix the bug with argv instead
        await env.sandbox.exec(["/bin/busybox", "sed", "-i", "s/ + 1))/))/", "/repo/calc.sh"])
        result = await grade(env.sandbox, repair_task().grader)
        assert result.exit_code == 0, result
    finally:
        await env.close()


async def test_an_early_exit_in_the_graded_code_earns_nothing(client):
    env = AsyncSandboxEnv(client, repair_task())
    try:
        await env.reset()
        await env.step("sed -i '1i exit 0' /repo/calc.sh")
        _, reward, *_ = await env.step({"name": "submit"})
        assert reward == 0.0
    finally:
        await env.close()
