"""Shared pollers: one peek loop and one connection per database in a process, however many consumers wait.

A triggerer may hold a thousand deferred sensors on a hundred queues. If each peeked on its own,
the database would answer a query per sensor per interval and hold a connection per sensor. A
:class:`Poller` holds one connection per database (per connection id), peeks each queue that
someone waits on once per interval -- and, where the database has notifications and senders use
them, wakes at once on a send -- and releases that queue's waiters when messages are there. Each
waiter then receives for itself, so competing waiters still get distinct messages through the
queue's own row locking, on a client the poller lends (:meth:`Poller.client`): opening a connection
costs more than the receive, and a deferred sensor that has just been woken is waiting for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from . import defaults
from . import operations as ops
from .breaker import CircuitBreaker
from .client import AsyncQueueClient
from .drivers import close_quietly
from .errors import TransportUnavailableError
from .logs import logger

log = logger("airflow_provider_sqlqueue.watch")

#: How long a poller with no waiters keeps its connection before it stops.
IDLE_GRACE_SECONDS = 5.0

#: Clients a poller lends its woken waiters at once, and keeps for the next ones: a burst of woken
#: waiters takes turns on these instead of opening a connection each.
LENT_CLIENTS = 4


@dataclass
class _Watch:
    """Waiters of one queue."""

    include_claims: bool
    pulse: asyncio.Event = field(default_factory=asyncio.Event)
    waiters: int = 0
    error: BaseException | None = None

    def wake(self) -> None:
        """Wake every waiter of the queue (a peek found messages, or an error they must see)."""
        pulse, self.pulse = self.pulse, asyncio.Event()
        pulse.set()


class Poller:
    """Peeks, on one connection, every queue of one database that a waiter of this process waits on.

    :param open_client: opens the poller's connection (reopened after a transport error) and the
        clients it lends its waiters; their defaults (error and audit queue) must be the database's,
        not one waiter's, since any waiter may borrow them.
    :param interval: seconds between rounds of peeks while the queues are empty.
    :param listen: also wake on the queues' send notifications (PostgreSQL LISTEN/NOTIFY); the
        interval stays as the fallback for senders that do not notify.
    """

    def __init__(
        self, open_client: Callable[[], Awaitable[AsyncQueueClient]], *, interval: float, listen: bool
    ) -> None:
        self._open_client = open_client
        self.interval = interval
        self.listen = listen
        self._watches: dict[tuple[str, bool], _Watch] = {}
        self._task: asyncio.Task[None] | None = None
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._on_stop: Callable[[], None] | None = None
        self._idle_clients: list[AsyncQueueClient] = []
        self._lending = asyncio.Semaphore(LENT_CLIENTS)
        #: Peeks run so far (observability and benchmarks).
        self.peeks = 0

    @property
    def queues(self) -> list[str]:
        return [queue for queue, _ in self._watches]

    async def wait(self, queue: str, *, include_claims: bool) -> None:
        """Return once a peek of ``queue`` saw messages (or a send notification arrived).

        Raises what made peeking the queue impossible (a missing table, a bad connection).
        """
        watch = self._watches.get((queue, include_claims))
        if watch is None or watch.error is not None:
            watch = self._watches[(queue, include_claims)] = _Watch(include_claims)
            self._wake.set()  # peek the new queue now, not after the current interval
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="sqlqueue-poller")
        pulse = watch.pulse
        watch.waiters += 1
        try:
            await pulse.wait()
        finally:
            watch.waiters -= 1
        if watch.error is not None:
            raise watch.error

    @asynccontextmanager
    async def client(self) -> AsyncIterator[AsyncQueueClient]:
        """A client for a woken waiter's receive: one a waiter gave back, else a new one.

        At most :data:`LENT_CLIENTS` are lent at once; more waiters wait for one. A kept client is
        asked one cheap statement before it is lent, since the database may have cut it while it
        waited, and replaced by a new one if it does not answer. It is kept for the next waiter
        only when the block ended without an error (a client an error left, or a cancelled
        receive, may be in any state) and the poller still runs; the poller closes the ones it
        keeps when it stops. The block must leave the session's settings as it found them.
        """
        async with self._lending:
            client = await self._lendable()
            try:
                yield client
            except BaseException:
                await close_quietly(client)
                raise
            if self._task is None or self._task.done():
                await close_quietly(client)
            else:
                self._idle_clients.append(client)

    async def _lendable(self) -> AsyncQueueClient:
        while self._idle_clients:
            client = self._idle_clients.pop()
            try:
                await client.session.run(ops.probe(client.dialect))
            except TransportUnavailableError as exc:
                log.info("Poller: a kept connection was cut while it waited (%s); opening another", exc)
                await close_quietly(client)
                continue
            return client
        return await self._open_client()

    async def _run(self) -> None:
        breaker = CircuitBreaker(
            base_delay=min(self.interval, 1.0),
            max_backoff=defaults.MAX_BACKOFF_SECONDS,
            alarm_after=defaults.BREAKER_ALARM_SECONDS,
        )
        client: AsyncQueueClient | None = None
        idle_since: float | None = None
        try:
            while True:
                waited = {key: watch for key, watch in self._watches.items() if watch.waiters}
                if not waited:
                    idle_since = idle_since or self._loop.time()
                    if self._loop.time() - idle_since >= IDLE_GRACE_SECONDS:
                        return
                    await self._pause(None)
                    continue
                idle_since = None
                try:
                    if client is None:
                        client = await self._open_client()
                        log.info(
                            "Poller: one connection peeks every %.3gs for this process's waiters%s",
                            self.interval,
                            ", woken by send notifications" if self.listen else "",
                        )
                    for (queue, include_claims), watch in waited.items():
                        await self._peek(client, queue, include_claims, watch)
                    breaker.success()
                except TransportUnavailableError as exc:
                    if client is not None:
                        await close_quietly(client)
                        client = None
                    await asyncio.sleep(breaker.failure(exc, ", ".join(queue for queue, _ in waited)))
                    continue
                except Exception as exc:  # noqa: BLE001  # the connection itself is unusable (wrong type, bad settings)
                    log.error("Poller: cannot open the queues' connection: %s", exc)
                    self._fail(waited, exc)
                    continue
                try:
                    await self._pause(client, [queue for queue, _ in waited])
                except TransportUnavailableError as exc:  # cut while listening: reconnect as after a failed peek
                    await close_quietly(client)
                    client = None
                    await asyncio.sleep(breaker.failure(exc, ", ".join(queue for queue, _ in waited)))
        except Exception as exc:  # no waiter may wait for a loop that has ended: each gets the error
            log.exception("Poller: stopped by an unexpected error; its waiters get it")
            self._fail(dict(self._watches), exc)
        finally:
            idle, self._idle_clients = [client, *self._idle_clients], []
            for each in idle:
                if each is not None:
                    await close_quietly(each)
            if self._on_stop is not None:
                self._on_stop()

    def _fail(self, watches: dict[tuple[str, bool], _Watch], error: BaseException) -> None:
        """Give ``watches``' waiters ``error`` and forget the queues: the next wait starts afresh."""
        for key, watch in watches.items():
            watch.error = error
            self._watches.pop(key, None)
            watch.wake()

    async def _peek(self, client: AsyncQueueClient, queue: str, include_claims: bool, watch: _Watch) -> None:
        try:
            pending = await client.peek(queue, include_claims=include_claims)
        except TransportUnavailableError:
            raise
        except Exception as exc:  # noqa: BLE001  # this queue cannot be used (missing table, bad name): tell its waiters
            log.error("Queue %s: cannot peek: %s", queue, exc)
            watch.error = exc
            del self._watches[(queue, include_claims)]
            watch.wake()
            return
        self.peeks += 1
        if pending:
            log.debug("Queue %s: %d waiting; releasing %d waiter(s)", queue, pending, watch.waiters)
            watch.wake()

    async def _pause(self, client: AsyncQueueClient | None, queues: list[str] | None = None) -> None:
        """Wait out the interval, ending early for a new queue or (when listening) a send notification."""
        self._wake.clear()
        if client is None or not queues or not self.listen:
            await self._sleep_or_wake(self.interval)
            return
        # Listen in slices, so a queue that gets its first waiter meanwhile is peeked within one.
        deadline = self._loop.time() + self.interval
        while not self._wake.is_set():
            remaining = deadline - self._loop.time()
            if remaining <= 0:
                return
            try:
                if await client.wait_for_notifications(queues, min(remaining, 0.5)):
                    return
            except TransportUnavailableError:
                raise
            except Exception as exc:  # noqa: BLE001  # a queue gone meanwhile: the next peek tells its waiters
                log.warning("Poller: cannot listen for %s now (%s); peeking at the interval", ", ".join(queues), exc)
                await self._sleep_or_wake(remaining)
                return

    async def _sleep_or_wake(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._wake.wait(), seconds)
        except TimeoutError:
            pass


_pollers: dict[Hashable, Poller] = {}


def shared_poller(key: Hashable, create: Callable[[], Poller]) -> Poller:
    """The event loop's poller for ``key`` (a database and polling settings), created on first use."""
    poller = _pollers.get(key)
    if poller is None or poller._loop is not asyncio.get_running_loop():  # noqa: SLF001  # private to this module's own classes
        poller = create()
        poller._on_stop = lambda: _forget(key, poller)  # noqa: SLF001  # private to this module's own classes
        _pollers[key] = poller
    return poller


def _forget(key: Hashable, poller: Poller) -> None:
    if _pollers.get(key) is poller:
        del _pollers[key]
