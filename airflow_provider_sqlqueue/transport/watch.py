"""Shared queue watchers: one peek loop per queue in a process, however many consumers wait on it.

A triggerer may hold hundreds of deferred sensors on the same few queues. If each peeked on its
own, the database would answer one query per sensor per interval for nothing. A
:class:`QueueWatcher` peeks once per interval for all of them (and, where the database has
notifications and senders use them, wakes at once on a send) and releases its waiters when
messages are there; each waiter then receives for itself, so competing waiters still get distinct
messages through the queue's own locking.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable

from .client import AsyncQueueClient
from .errors import TransportUnavailableError
from .pump import CircuitBreaker

log = logging.getLogger("airflow_provider_sqlqueue.watch")

#: How long a watcher with no waiters keeps its connection before it stops.
IDLE_GRACE_SECONDS = 5.0


class QueueWatcher:
    """Peeks one queue for every waiter in the process.

    :param open_client: opens the watcher's own connection (reopened after a transport error).
    :param queue: the queue's name or address.
    :param include_claims: count claims whose lease ran out as waiting (claim mode).
    :param interval: seconds between peeks while the queue is empty.
    :param listen: also wake on the queue's send notifications (PostgreSQL LISTEN/NOTIFY); the
        interval stays as the fallback for senders that do not notify.
    """

    def __init__(
        self,
        open_client: Callable[[], Awaitable[AsyncQueueClient]],
        queue: str,
        *,
        include_claims: bool,
        interval: float,
        listen: bool,
        on_stop: Callable[[], None] | None = None,
    ) -> None:
        self._open_client = open_client
        self.queue = queue
        self.include_claims = include_claims
        self.interval = interval
        self.listen = listen
        self._on_stop = on_stop
        self._pulse = asyncio.Event()
        self._waiters = 0
        self._error: BaseException | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop = asyncio.get_running_loop()
        #: Peeks run so far (observability and benchmarks).
        self.peeks = 0

    async def wait(self) -> None:
        """Return once a peek saw messages (or a send notification arrived); raise what made peeking impossible."""
        if self._error is not None:
            raise self._error
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=f"sqlqueue-watch-{self.queue}")
        pulse = self._pulse
        self._waiters += 1
        try:
            await pulse.wait()
        finally:
            self._waiters -= 1
        if self._error is not None:
            raise self._error

    def _release(self) -> None:
        pulse, self._pulse = self._pulse, asyncio.Event()
        pulse.set()

    async def _run(self) -> None:
        breaker = CircuitBreaker(base_delay=min(self.interval, 1.0), max_backoff=30.0, alarm_after=120.0)
        client: AsyncQueueClient | None = None
        idle_since: float | None = None
        loop = asyncio.get_running_loop()
        try:
            while True:
                if self._waiters == 0:
                    idle_since = idle_since or loop.time()
                    if loop.time() - idle_since >= IDLE_GRACE_SECONDS:
                        return
                    await asyncio.sleep(min(self.interval, 0.5))
                    continue
                idle_since = None
                try:
                    if client is None:
                        client = await self._open_client()
                        log.info(
                            "Queue %s: one watcher peeks every %.3gs for this process%s",
                            self.queue,
                            self.interval,
                            " and wakes on send notifications" if self.listen else "",
                        )
                    pending = await client.peek(self.queue, include_claims=self.include_claims)
                    self.peeks += 1
                    breaker.success()
                    if pending:
                        log.debug("Queue %s: %d waiting; releasing %d waiter(s)", self.queue, pending, self._waiters)
                        self._release()
                    if self.listen:
                        await client.wait_for_notification(self.queue, self.interval)
                    else:
                        await asyncio.sleep(self.interval)
                except TransportUnavailableError as exc:
                    if client is not None:
                        await _close_quietly(client)
                        client = None
                    await asyncio.sleep(breaker.failure(exc, self.queue))
        except Exception as exc:  # a missing table, a bad connection: every waiter gets the error
            log.error("Queue %s: watcher stopped: %s", self.queue, exc)
            self._error = exc
            self._release()
        finally:
            if client is not None:
                await _close_quietly(client)
            if self._on_stop is not None:
                self._on_stop()


_watchers: dict[Hashable, QueueWatcher] = {}


def shared_watcher(key: Hashable, create: Callable[[], QueueWatcher]) -> QueueWatcher:
    """The event loop's watcher for ``key``, created on first use (call from the loop that waits on it)."""
    watcher = _watchers.get(key)
    if watcher is None or watcher._error is not None or watcher._loop is not asyncio.get_running_loop():
        watcher = create()
        watcher._on_stop = lambda: _forget(key, watcher)
        _watchers[key] = watcher
    return watcher


def _forget(key: Hashable, watcher: QueueWatcher) -> None:
    if _watchers.get(key) is watcher:
        del _watchers[key]


async def _close_quietly(client: AsyncQueueClient) -> None:
    try:
        await client.close()
    except Exception:  # the connection is already broken
        pass
