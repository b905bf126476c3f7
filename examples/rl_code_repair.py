"""64 parallel episodes of a small code-repair task set, with hidden grading as the reward.

Each task is a repository with a failing test: a shell function with a bug. The agent sees
the repository, never the test; at the end the grader packs the agent's /repo, runs the
hidden test in a separate sandbox, and exit 0 is reward 1. The "policy" here is a scripted
stand-in for a model: it fixes the bug with probability ``--skill`` and otherwise pokes at
the code. Run against a dsec server (DSEC_URL / DSEC_STATE_DIR, else the local default):

    python examples/rl_code_repair.py --episodes 64 --skill 0.7
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

import dsec
from dsec.rl import AsyncSandboxEnv, Grader, Task

# (buggy source, correct fix as a sed expression, hidden test cases: call, expected output)
TASKS = {
    "add": ("add() { echo $(($1 + $2 + 1)); }\n", "s/ + 1))/))/",
            [("add 2 3", "5"), ("add 0 0", "0")]),
    "mul": ("mul() { echo $(($1 + $2)); }\n", "s/\\$1 + \\$2/$1 * $2/",
            [("mul 3 4", "12"), ("mul 5 0", "0")]),
    "max": ("max() { if [ $1 -lt $2 ]; then echo $1; else echo $2; fi; }\n", "s/-lt/-gt/",
            [("max 3 9", "9"), ("max 7 2", "7")]),
    "neg": ("neg() { echo $1; }\n", "s/echo \\$1/echo $((0 - $1))/",
            [("neg 5", "-5"), ("neg -2", "2")]),
}


def make_task(name: str) -> Task:
    src, _, cases = TASKS[name]
    # The agent's code runs only inside $(...): an early `exit 0` in it cannot end the
    # test with success, it only yields a wrong answer.
    checks = " && ".join(f'[ "$(. /repo/lib.sh; {call})" = "{want}" ]' for call, want in cases)
    hidden = f"#!/bin/sh\n{checks}\n".encode()
    return Task(prompt=f"The function {name} in /repo/lib.sh is wrong; fix it.",
                files={"/repo/lib.sh": src.encode()},
                grader=Grader(workspace="/repo", cmd="/grader/test.sh",
                              files={"/grader/test.sh": hidden}))


async def episode(client: dsec.AsyncClient, name: str, skill: float, rng: random.Random,
                  job: str) -> float:
    env = AsyncSandboxEnv(client, make_task(name), max_steps=6, memory_mb=64, job=job)
    try:
        await env.reset()
        await env.step("cat /repo/lib.sh")
        fix = TASKS[name][1] if rng.random() < skill else "s/echo/echo  /"
        await env.step(f"sed -i '{fix}' /repo/lib.sh")
        _, reward, *_ = await env.step({"name": "submit"})
        return reward
    finally:
        await env.close()


async def main(episodes: int, skill: float, seed: int) -> None:
    rng = random.Random(seed)
    job = f"job-repair-{int(time.time())}"
    names = [rng.choice(sorted(TASKS)) for _ in range(episodes)]
    async with dsec.AsyncClient() as client:
        t0 = time.perf_counter()
        try:
            rewards = await asyncio.gather(*(episode(client, n, skill, random.Random(rng.random()),
                                                     job) for n in names))
        finally:
            await client.jobs.stop(job)
        took = time.perf_counter() - t0
    by_task: dict[str, list[float]] = {}
    for n, r in zip(names, rewards):
        by_task.setdefault(n, []).append(r)
    print(f"{episodes} episodes in {took:.1f} s; mean reward {sum(rewards) / episodes:.2f}")
    for n, rs in sorted(by_task.items()):
        print(f"  {n:4s} {len(rs):3d} episodes, mean reward {sum(rs) / len(rs):.2f}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--episodes", type=int, default=64)
    p.add_argument("--skill", type=float, default=0.7)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    asyncio.run(main(a.episodes, a.skill, a.seed))
