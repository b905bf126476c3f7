import pytest

import dsec
from dsec.api.errors import ERROR_TABLE, DSecError, error_from_wire


@pytest.mark.parametrize("code,cls", sorted(ERROR_TABLE.items()))
def test_every_code_round_trips(code, cls):
    err = cls("boom")
    back = error_from_wire(err.to_wire(), err.status)
    assert type(back) is cls and back.message == "boom" and back.code == code


def test_leaves_inherit_builtins():
    assert issubclass(dsec.SandboxTimeout, TimeoutError)
    assert issubclass(dsec.NotFound, LookupError)
    assert issubclass(dsec.InvalidArgument, ValueError)
    assert issubclass(dsec.Unsupported, NotImplementedError)
    assert all(issubclass(c, DSecError) for c in ERROR_TABLE.values())


def test_statuses_are_distinct_per_meaning():
    assert ERROR_TABLE["not_found"].status == 404
    assert ERROR_TABLE["unauthorized"].status == 401
    assert ERROR_TABLE["capacity"].status == 429
    assert ERROR_TABLE["invalid_argument"].status == 400


def test_unknown_shape_becomes_internal():
    err = error_from_wire("<html>", 502)
    assert isinstance(err, dsec.Internal) and "502" in err.message


def test_shorten_cuts_long_values_and_says_how_long():
    from dsec.api.errors import shorten
    assert shorten("sb-1") == "sb-1"
    out = shorten("x" * 5000)
    assert out.startswith("x" * 100) and out.endswith("… (5000 characters)") and len(out) < 130


def test_a_file_error_names_a_long_path_shortened():
    import errno

    from dsec.api.errors import InvalidArgument
    from dsec.node.host.rooted import _Errors
    with pytest.raises(InvalidArgument, match="File name too long") as err:
        with _Errors("/" + "x" * 10_000):
            raise OSError(errno.ENAMETOOLONG, "File name too long")
    assert len(str(err.value)) < 200
