"""SandboxEnv: reset, tool steps, hidden grading as the reward, close."""

import dsec
from dsec.rl import AsyncSandboxEnv, AsyncToolAdapter, SandboxEnv
from tests.rl.tasks import FIX, repair_task


async def test_a_repaired_repo_earns_the_reward(client):
    env = AsyncSandboxEnv(client, repair_task())
    try:
        prompt, info = await env.reset()
        assert "calc.sh" in prompt
        obs, reward, done, truncated, _ = await env.step("cat /repo/calc.sh")
        assert "+ 1" in obs and (reward, done, truncated) == (0.0, False, False)
        await env.step(FIX)
        obs, reward, done, truncated, info = await env.step({"name": "submit"})
        assert (reward, done, truncated) == (1.0, True, False), info["grade"]
    finally:
        await env.close()


async def test_an_unrepaired_repo_earns_nothing_and_max_steps_truncates(client):
    env = AsyncSandboxEnv(client, repair_task(), max_steps=2)
    try:
        await env.reset()
        await env.step("true")
        _, reward, done, truncated, _ = await env.step("echo still buggy")
        assert (reward, done, truncated) == (0.0, False, True)
    finally:
        await env.close()
    assert env.sandbox is None


async def test_grading_sandboxes_do_not_outlive_the_grade(client):
    env = AsyncSandboxEnv(client, repair_task())
    try:
        await env.reset()
        await env.step({"name": "submit"})
        assert [s for s in await client.list() if s.labels.get("role") == "grader"] == []
    finally:
        await env.close()


async def test_a_reattached_env_fast_forwards_logged_tool_calls(client):
    env = AsyncSandboxEnv(client, repair_task())
    try:
        _, info = await env.reset()
        first = await env.step("echo x >> /tmp/n; wc -l < /tmp/n")
        again = AsyncSandboxEnv(client, repair_task())
        await again.reset(sandbox_id=info["sandbox_id"])
        assert await again.step("echo x >> /tmp/n; wc -l < /tmp/n") == first
        live, *_ = await again.step("wc -l < /tmp/n")
        assert live.endswith("1\n")
    finally:
        await env.close()


def test_sync_env_and_tool_adapter(sync_client):
    env = SandboxEnv(sync_client, repair_task())
    try:
        _, info = env.reset()
        obs, *_ = env.step({"name": "read_file", "arguments": '{"path": "/repo/calc.sh"}'})
        assert obs.startswith("add()")
        obs, *_ = env.step({"name": "nope"})
        assert "unknown tool" in obs
    finally:
        env.close()


async def test_tool_adapter_reports_errors_as_text(sandbox):
    tools = AsyncToolAdapter(sandbox)
    assert (await tools({"name": "bash", "arguments": {"command": "exit 3"}})) == "[exit 3]\n"
    out = await tools({"function": {"name": "read_file", "arguments": '{"path": "/nope"}'}})
    assert out.startswith("[error] NotFound")
    assert isinstance(dsec.NotFound("x"), dsec.DSecError)
