"""Group commit: appends made in the same pass of the event loop share one transaction.

Every call still waits for its own entry to be committed before it answers, so what a
caller was told survives a SIGKILL of the node, and each sandbox's entries keep the order
of the appends. Under load many execs end in one pass of the loop; one transaction for all
of them writes each touched page to the WAL once instead of once per exec, and keeps the
loop's time in SQLite per exec small.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from dsec.trajectory.log import TrajectoryLog

__all__ = ["GroupCommit"]

Item = tuple[str, str | None, str, str, dict, dict]  # sandbox, step, kind, fp, req, result


class GroupCommit:
    """Queue appends to ``log`` and commit them together on the loop's next pass.

    ``committed(item, seq)`` runs for each entry as its transaction commits, whether or
    not its caller still waits (an index of the log must not miss an entry)."""

    def __init__(self, log: TrajectoryLog,
                 committed: Callable[[Item, int], None] = lambda item, seq: None) -> None:
        self.log = log
        self.committed = committed
        self._pending: list[tuple[Item, asyncio.Future]] = []

    async def append(self, sandbox: str, step: str | None, kind: str, fingerprint: str,
                     request: dict, result: dict) -> int:
        """Append one entry; its sequence number once it is committed."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._pending.append(((sandbox, step, kind, fingerprint, request, result), fut))
        if len(self._pending) == 1:
            loop.call_soon(self.flush)
        # A caller cancelled meanwhile (its client went away) cancels only its wait: the
        # entry stays in the batch, as the run it records happened.
        return await fut

    def flush(self) -> None:
        """Commit what is queued now (also before a write that must follow it)."""
        batch, self._pending = self._pending, []
        if not batch:
            return
        try:
            seqs = self.log.append_many([item for item, _ in batch])
        except Exception as exc:
            if len(batch) == 1:
                _failed(batch[0][1], exc)
                return
            # one bad entry must not fail the others: each alone, in order
            for item, fut in batch:
                try:
                    (seq,) = self.log.append_many([item])
                except Exception as one:
                    _failed(fut, one)
                else:
                    self._settle(item, fut, seq)
            return
        for (item, fut), seq in zip(batch, seqs):
            self._settle(item, fut, seq)

    def _settle(self, item: Item, fut: asyncio.Future, seq: int) -> None:
        self.committed(item, seq)
        if not fut.done():
            fut.set_result(seq)


def _failed(fut: asyncio.Future, exc: Exception) -> None:
    if not fut.done():
        fut.set_exception(exc)
