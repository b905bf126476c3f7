"""client.jobs has a blocking twin with the same methods and parameters (the return types,
mapped to blocking ones, are compared in tests/sdk/test_parity.py)."""

import inspect

import dsec
from dsec.sdk.jobs import AsyncJobs
from dsec.sdk.sync import Jobs


def test_sync_jobs_mirror_async_jobs():
    names = {n for n, f in vars(AsyncJobs).items() if not n.startswith("_") and callable(f)}
    assert names == {"list", "get", "attach", "pause", "resume", "stop", "heartbeat"}
    for n in names:
        assert inspect.signature(getattr(Jobs, n)).parameters \
            == inspect.signature(getattr(AsyncJobs, n)).parameters


def test_sync_client_hands_out_sync_jobs():
    with dsec.Client("http://127.0.0.1:9", "t") as c:
        assert isinstance(c.jobs, Jobs)
