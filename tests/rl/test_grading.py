"""grade() leaves nothing behind in the image store: no tag, no layer, no sandbox."""

from dsec.rl import AsyncSandboxEnv, grade
from tests.rl.tasks import FIX, repair_task


def _layers(server) -> set[str]:
    return {p.name for p in (server.state_dir / "images/blobs/sha256").iterdir()}


async def test_grading_removes_its_tag_and_layer(client, server):
    env = AsyncSandboxEnv(client, repair_task())
    try:
        await env.reset()
        await env.step(FIX)
        tags, layers = {i.name for i in await client.images()}, _layers(server)
        for _ in range(2):
            result = await grade(env.sandbox, repair_task().grader)
            assert result.exit_code == 0, result
        assert {i.name for i in await client.images()} == tags
        assert _layers(server) == layers
        assert [s for s in await client.list() if s.labels.get("role") == "grader"] == []
    finally:
        await env.close()


async def test_a_tag_the_caller_names_is_kept(client, server):
    env = AsyncSandboxEnv(client, repair_task())
    try:
        await env.reset()
        await grade(env.sandbox, repair_task().grader, tag="graded/kept:v1")
        assert "graded/kept:v1" in {i.name for i in await client.images()}
        await client.remove_image("graded/kept:v1")
        assert "graded/kept:v1" not in {i.name for i in await client.images()}
    finally:
        await env.close()
