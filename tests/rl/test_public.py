"""dsec.rl exports exactly its intended names."""

import dsec.rl


def test_rl_names():
    assert set(dsec.rl.__all__) == {"AsyncSandboxEnv", "SandboxEnv", "Task", "Grader", "grade",
                                    "TOOLS", "AsyncToolAdapter", "ToolAdapter"}
    for name in dsec.rl.__all__:
        assert getattr(dsec.rl, name) is not None

