"""The locks that make one client's calls take turns on its one connection."""

from __future__ import annotations

import asyncio
import threading


class TaskLock:
    """asyncio's lock, re-entrant for the task that holds it, as ``threading.RLock`` is for a thread.

    Calls on one client take turns on its one connection. A task inside :meth:`AsyncQueueClient.transaction`
    or :meth:`AsyncQueueClient.receive_native` holds the lock and may call the client again (its
    calls then join that transaction); other tasks wait -- including tasks the block itself starts
    (``asyncio.gather``, and ``asyncio.wait_for`` before Python 3.12, which runs its argument as a new
    task), which would wait for the block to end: call the client from the task that holds it.
    """

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._owner: object = None
        self._depth = 0

    async def __aenter__(self) -> None:
        task = asyncio.current_task()
        if self._owner is not task:
            await self._lock.acquire()
            self._owner = task
        self._depth += 1

    async def __aexit__(self, *exc: object) -> None:
        self._depth -= 1
        if not self._depth:
            self._owner = None
            self._lock.release()


class ThreadLock:
    """``threading.RLock`` behind :class:`TaskLock`'s interface, for a client whose calls block (:class:`QueueClient`)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()

    async def __aenter__(self) -> None:
        self._lock.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self._lock.release()
