"""Schemathesis against the embedded server's own /openapi.json (issue 13): no request it
generates, valid or not, may get a server error, and afterwards the list still answers and
no sandbox exists that no caller was given (the checks: tests/support/fuzz.py).

Bounded in time: a few examples per operation and mode (``FUZZ_EXAMPLES``, default 30;
about a minute on two cores).
"""

from __future__ import annotations

import pytest

from tests.support import fuzz
from tests.support.fuzz import http, live  # noqa: F401  (fixtures)
from tests.support.server import ServerProcess, leftovers

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def fuzzed():
    srv = ServerProcess().start()
    yield srv
    srv.stop_all_sandboxes()
    srv.stop()
    left = leftovers(srv.state_dir)
    srv.destroy()
    assert not left, f"the fuzz left things behind: {left}"


def test_no_request_gets_a_server_error(http, live, fuzzed):
    failures = fuzz.fuzz_every_operation(fuzz.schema(fuzzed.url, fuzzed.token), http, live,
                                         fuzzed.token)
    assert not failures, "\n\n".join(failures)


def test_afterwards_the_list_answers_and_no_sandbox_is_unreturned(http, live):
    """Runs after the fuzz (pytest keeps file order)."""
    left = fuzz.unreturned(http, live)
    assert not left, f"sandboxes no caller was given: {left}"
