"""A real repository's test suite in a container sandbox of the Debian image (python3, git)."""

import asyncio

import pytest

from tests.support.images import ensure_debian_image

pytestmark = pytest.mark.timeout(900)

CALC = '''def add(a, b):
    return a + b


def mul(a, b):
    return a * b
'''

TESTS = '''import unittest

from calc import add, mul


class CalcTest(unittest.TestCase):
    def test_add(self):
        self.assertEqual(add(2, 3), 5)

    def test_mul(self):
        self.assertEqual(mul(2, 3), 6)


if __name__ == "__main__":
    unittest.main()
'''


async def test_repository_tests_pass_then_a_regression_fails(server, client):
    await asyncio.to_thread(ensure_debian_image, server.state_dir)
    sb = await client.create(image="python:3.11", memory_mb=512)
    try:
        await sb.files.write("/repo/calc.py", CALC)
        await sb.files.write("/repo/test_calc.py", TESTS)
        sh = await sb.shell()
        r = await sh.run("cd /repo && git init -q && git add . && "
                         "git -c user.email=a@b -c user.name=dsec commit -qm init && "
                         "git log --oneline | wc -l")
        assert r.exit_code == 0 and r.stdout.strip() == "1", r.stderr
        r = await sh.run("python3 -B -m unittest -v 2>&1", timeout=120)
        assert r.exit_code == 0 and "Ran 2 tests" in r.stdout and "OK" in r.stdout
        await sh.run("sed -i 's/a \\* b/a + b/' calc.py")
        r = await sh.run("python3 -B -m unittest 2>&1", timeout=120)
        assert r.exit_code == 1 and "FAILED (failures=1)" in r.stdout
        assert "calc.py" in (await sh.run("git status --short")).stdout
    finally:
        await sb.stop()
