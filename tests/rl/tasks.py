"""A tiny code-repair task for the env tests: a shell function with an off-by-one bug."""

from dsec.rl import Grader, Task

BUGGY = b"add() { echo $(($1 + $2 + 1)); }\n"
FIX = "sed -i 's/ + 1))/))/' /repo/calc.sh"
# The agent's code runs only inside $(...): an early `exit 0` in it yields no output and
# fails the comparison instead of ending the test with success.
HIDDEN_TEST = b"""#!/bin/sh
[ "$(. /repo/calc.sh; add 2 3)" = 5 ] && [ "$(. /repo/calc.sh; add 0 0)" = 0 ]
"""


def repair_task() -> Task:
    return Task(prompt="Fix add() in /repo/calc.sh; the hidden tests call add 2 3.",
                files={"/repo/calc.sh": BUGGY},
                grader=Grader(workspace="/repo", cmd="/grader/test.sh",
                              files={"/grader/test.sh": HIDDEN_TEST}))
