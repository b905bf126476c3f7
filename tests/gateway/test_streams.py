"""The pty WebSocket: clients that leave and malformed control frames, as the server logs
and answers them."""

import asyncio
import json

import pytest

from dsec.sdk.pty import open_pty


async def _log_after(server, before: int, wait: float = 1.0) -> str:
    await asyncio.sleep(wait)  # the server handles the close after the client is gone
    with open(server.state_dir / "server.log", "rb") as f:
        f.seek(before)
        return f.read().decode(errors="replace")


def _log_size(server) -> int:
    return (server.state_dir / "server.log").stat().st_size


async def _started(ws) -> None:
    await ws.send(b"echo ready\n")
    seen = b""
    while b"ready" not in seen:
        seen += await asyncio.wait_for(ws.recv(), 30)


async def test_client_leaving_a_pty_logs_no_error_and_ends_the_shell(server, sandbox):
    before = _log_size(server)
    for leave in ("close", "abort", "close on exit"):
        ws = await open_pty(server.url, server.token, sandbox.id, 24, 80)
        await _started(ws)
        if leave == "close on exit":  # as dsec shell does once the shell exited
            await ws.send(b"exit\n")
            while isinstance(await asyncio.wait_for(ws.recv(), 10), bytes):
                pass
            await ws.close()
        else:
            await ws.send(b"sleep 1001\n")
            await ws.close() if leave == "close" else ws.transport.abort()
    log = await _log_after(server, before, 1.5)
    assert "Traceback" not in log and "Exception in ASGI" not in log, log
    r = await sandbox.exec("ps -o args | grep -c '[s]leep 1001'")
    assert r.stdout.strip() == "0", "the terminals the clients left still run"


@pytest.mark.parametrize("frame", ["not json", '{"resize": "big"}', "[1, 2]",
                                   '{"resize": [24, 80, 1]}', '{"other": 1}'])
async def test_malformed_control_frame_gets_an_error_and_1007(server, sandbox, frame):
    before = _log_size(server)
    ws = await open_pty(server.url, server.token, sandbox.id, 24, 80)
    await _started(ws)
    await ws.send(frame)
    while isinstance(msg := await asyncio.wait_for(ws.recv(), 10), bytes):
        pass
    body = json.loads(msg)["error"]
    assert body["code"] == "invalid_argument" and '{"resize": [rows, cols]}' in body["message"]
    await asyncio.wait_for(ws.wait_closed(), 10)
    assert ws.close_code == 1007
    assert "Traceback" not in await _log_after(server, before, 0.2)


async def test_a_shell_killed_in_a_running_sandbox_reports_its_exit(sandbox):
    """A terminal whose shell dies while its sandbox runs ends with the exit code; only a
    shell that a stop killed is reported as the sandbox stopped."""
    t = await sandbox.pty()
    await t.read(timeout=10)
    await t.write(b"kill -9 $$\n")
    while await t.read(timeout=10):
        pass
    assert t.exit_code == 137
    assert (await sandbox.exec("true")).exit_code == 0
