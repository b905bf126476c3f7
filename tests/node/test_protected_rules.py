"""The pure decisions of :mod:`dsec.node.protected`: which resolved paths are refused."""

import pytest

from dsec.api.errors import Forbidden
from dsec.node.protected import check_path, check_tree, covering, inside

P = ["/grader", "/repo/tests/hidden.sh"]


@pytest.mark.parametrize("path,hit", [
    ("/grader", "/grader"), ("/grader/a/b", "/grader"),
    ("/repo/tests/hidden.sh", "/repo/tests/hidden.sh"),
    ("/graderx", None), ("/repo/tests", None), ("/", None), ("/repo/tests/hidden.shx", None),
])
def test_covering_is_the_path_or_under_it(path, hit):
    assert covering(P, path) == hit


def test_inside_also_sees_one_below():
    assert inside(P, "/") == "/grader" and inside(P, "/repo") == "/repo/tests/hidden.sh"
    assert inside(P, "/tmp") is None


def test_refusals_name_the_path_and_where_it_led():
    with pytest.raises(Forbidden, match=r"^/tmp/l \(it resolves to /grader/s\) is protected"):
        check_path(P, "/tmp/l", "/grader/s")
    with pytest.raises(Forbidden, match=r"^/grader/a/b is protected: /grader is one"):
        check_path(P, "/grader/a/b", "/grader")  # a directory on the way: no "resolves"
    with pytest.raises(Forbidden, match="^/repo holds the protected path /repo/tests/hidden"):
        check_tree(P, "/repo", "/repo")
    check_path(P, "/repo/tests", "/repo/tests")
    check_tree(P, "/tmp", "/tmp")
