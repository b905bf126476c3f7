"""A pool of warm workers for one (image, memory, disk) key.

A call takes an idle worker, or starts one while the pool is under ``max_size``, or waits.
A worker goes back to the idle list only if its call ended cleanly and left nothing behind;
otherwise it is stopped and, in the background, a fresh one is started so ``warm`` workers
stay ready. A pool with no calls for ``idle_s`` seconds shuts its workers down.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from dsec.node.backends.fncall.worker import Worker, WorkerKey

__all__ = ["Pool"]

log = logging.getLogger("dsec.fncall")


class Pool:
    def __init__(self, key: WorkerKey, factory: Callable[[], Awaitable[Worker]],
                 max_size: int, warm: int) -> None:
        self.key = key
        self._factory = factory
        self.max_size = max_size
        self.warm = min(warm, max_size)
        self.idle: list[Worker] = []
        self.size = 0          # workers running or starting, idle or busy
        self.replaced = 0      # workers thrown away after a bad or dirty call
        self.last_used = time.monotonic()
        self._changed = asyncio.Condition()
        self._tasks: set[asyncio.Task] = set()
        self._closed = False

    async def acquire(self) -> Worker:
        self.last_used = time.monotonic()
        async with self._changed:
            while not self.idle and self.size >= self.max_size:
                await self._changed.wait()
            if self.idle:  # oldest first: calls rotate over the warm workers
                return self.idle.pop(0)
            self.size += 1
        try:
            return await self._factory()
        except BaseException:
            await self._shrink()
            raise

    async def release(self, worker: Worker) -> None:
        self.last_used = time.monotonic()
        if worker.healthy and not self._closed:
            async with self._changed:
                self.idle.append(worker)
                self._changed.notify()
            return
        self.replaced += 1
        self._spawn(self._retire(worker))

    async def _retire(self, worker: Worker) -> None:
        await worker.stop()
        await self._shrink()
        self.fill()

    async def _shrink(self) -> None:
        async with self._changed:
            self.size -= 1
            self._changed.notify()

    def fill(self) -> None:
        """Start workers in the background until ``warm`` are running."""
        while not self._closed and self.size < self.warm:
            self.size += 1
            self._spawn(self._start_idle())

    async def _start_idle(self) -> None:
        try:
            worker = await self._factory()
        except Exception as exc:
            log.warning("could not start a warm fncall worker for %s: %s", self.key, exc)
            await self._shrink()
            return
        if self._closed:
            await worker.stop()
            return
        async with self._changed:
            self.idle.append(worker)
            self._changed.notify()

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Stop every worker. The stops are tasks of their own (``asyncio.wait`` does not
        cancel them), so a close that is cancelled half-way can be finished by calling it
        again."""
        self._closed = True
        idle, self.idle = self.idle, []
        for worker in idle:
            self._spawn(worker.stop())
        while self._tasks:
            await asyncio.wait(list(self._tasks))
