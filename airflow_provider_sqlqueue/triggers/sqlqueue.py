"""Triggers that run the queue's peek/receive loop inside the triggerer.

Both wait while the queue is empty and receive as soon as something waits. Waiting is shared: all
triggers of one triggerer on the same connection wait on one
:class:`~airflow_provider_sqlqueue.transport.watch.Poller`, which holds one connection and peeks
each waited-on queue every ``peek_interval`` seconds (and, with ``wake_on_notify``, wakes at once
on a sender's NOTIFY), so a thousand deferred sensors cost the database one connection and one
peek per queue per interval.

In ``claim`` mode (the default) a trigger *reserves* what it receives: the messages move to the
in-flight store under a short hand-off lease (``lease``, 2 minutes by default) without
counting a delivery, and the task that works on them *takes* them (a new token, a counted
delivery) and renews the lease while it works. If the triggerer dies between its receive and
Airflow storing the event, or nobody comes for the messages (a paused DAG), the reservation runs
out within one lease and the messages are received again, with none of their ``max_deliveries``
spent. Nothing is lost and a message has one owner at a time.

* :class:`SqlQueueTrigger` fires once with a batch of up to ``max_messages`` messages; the
  deferrable :class:`~airflow_provider_sqlqueue.sensors.sqlqueue.SqlQueueSensor` waits on it.
* :class:`SqlQueueEventTrigger` never finishes and fires one event per message, for
  ``AssetWatcher`` (one DAG run per message), directly or through common-messaging's
  ``MessageQueueTrigger(scheme="sqlqueue", ...)``.
"""

from __future__ import annotations

import asyncio
import importlib
import math
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseEventTrigger, BaseTrigger, TriggerEvent

from ..transport import defaults
from ..transport.addressing import checked_text
from ..transport.errors import InvalidArgumentError, SqlQueueError
from ..transport.message import TransactionMode, check_positive, duration, flag

if TYPE_CHECKING:
    from ..transport.client import AsyncQueueClient
    from ..transport.watch import Poller

#: The triggerer imports this module on its event loop, so it imports only what the trigger
#: classes need to exist. The hook with the database providers and drivers, and the transport's
#: loop machinery (together 0.3-0.8 s on a busy machine) are imported on a worker thread when a
#: trigger starts.
RUNTIME_MODULES = (
    "airflow_provider_sqlqueue.hooks.sqlqueue",
    "airflow_provider_sqlqueue.transport.watch",
    "airflow_provider_sqlqueue.transport.pump",
    "airflow_provider_sqlqueue.transport.drivers",
)


def _import_runtime() -> None:
    for name in RUNTIME_MODULES:
        importlib.import_module(name)


#: The gauges of each connection a triggerer's triggers wait on, sent from that triggerer:
#: (event loop, connection id) -> [the sending task, how many triggers wait on the connection].
_reporters: dict[tuple[int, str], list[Any]] = {}


def _health_interval() -> float:
    """``[sqlqueue] health_metrics_interval``, or 0 while Airflow's metrics are off (nothing would be sent).

    A value that is no number of seconds is logged and means the default: a typo in a metrics
    setting must not stop the triggers that run DAGs. Below ``defaults.MIN_HEALTH_METRICS_INTERVAL``
    (but above 0) it is raised to that, so a survey of every queue never runs back to back.
    """
    import logging

    from airflow.sdk import conf

    if not (
        conf.getboolean("metrics", "statsd_on", fallback=False) or conf.getboolean("metrics", "otel_on", fallback=False)
    ):
        return 0.0
    text = conf.get("sqlqueue", "health_metrics_interval", fallback=str(defaults.HEALTH_METRICS_INTERVAL))
    try:
        interval = float(text)
    except (TypeError, ValueError):
        interval = math.nan
    if not math.isfinite(interval):
        logging.getLogger(__name__).error(
            "[sqlqueue] health_metrics_interval is %r, not a number of seconds; using %ss",
            text,
            defaults.HEALTH_METRICS_INTERVAL,
        )
        return defaults.HEALTH_METRICS_INTERVAL
    return 0.0 if interval <= 0 else max(interval, defaults.MIN_HEALTH_METRICS_INTERVAL)


def _report_health(conn_id: str, interval: float) -> Callable[[], None]:
    """Send the gauges of ``conn_id``'s queues every ``interval`` seconds while a trigger waits on it
    (one sender per connection and triggerer, however many triggers); returns what the trigger calls
    when it ends. The queues' health then shows in the metrics continuously, not only when a DAG runs
    ``QueueMetricsOperator``."""
    if interval <= 0:
        return lambda: None
    key = (id(asyncio.get_running_loop()), conn_id)
    entry = _reporters.get(key)
    if entry is None:
        entry = _reporters[key] = [asyncio.create_task(_send_health(conn_id, interval)), 0]
    entry[1] += 1

    def release() -> None:
        entry[1] -= 1
        if entry[1] == 0 and _reporters.get(key) is entry:
            entry[0].cancel()
            del _reporters[key]

    return release


async def _send_health(conn_id: str, interval: float) -> None:
    def emit() -> None:  # on a worker thread: it connects, queries and sends with blocking calls
        from ..hooks.sqlqueue import SqlQueueHook
        from ..metrics import emit_queue_metrics

        emit_queue_metrics([conn_id], lambda name: SqlQueueHook(name).client())

    while True:
        await asyncio.to_thread(emit)
        await asyncio.sleep(interval)


def lease_seconds(lease: timedelta | float) -> float:
    """A lease as seconds (what serialises into trigger kwargs), checked as the core checks leases."""
    return duration("lease", lease, maximum=defaults.MAX_LEASE, minimum=defaults.MIN_RENEWED_LEASE).total_seconds()


def receiving_mode(mode: TransactionMode | str) -> TransactionMode:
    """The transaction mode a trigger or sensor can receive in: ``claim`` or ``none``."""
    mode = TransactionMode(mode)
    if mode is TransactionMode.NATIVE:
        raise InvalidArgumentError(
            "transaction_mode 'native' holds the receive transaction open while the message is handled, which "
            "cannot span a trigger and a task; use 'claim' (at-least-once, ack after success) or 'none'"
        )
    return mode


class SqlQueueTrigger(BaseTrigger):
    """Wait for messages on a queue table and fire once with up to ``max_messages`` of them.

    The event payload is ``{"status": "success", "messages": [...]}`` where each message is
    :meth:`~airflow_provider_sqlqueue.transport.message.ReceivedMessage.to_dict`, or
    ``{"status": "error", "message": ...}`` when the queue cannot be used at all (missing table,
    wrong connection type). An unreachable database is not an error: the loop backs off and retries.

    :param sqlqueue_conn_id: connection of the queue's database.
    :param queue_name: the queue, in the database's address syntax.
    :param max_messages: most messages received per event.
    :param transaction_mode: ``claim`` (leased until acknowledged) or ``none`` (deleted on receipt).
    :param peek_interval: seconds between peeks while the queue is empty.
    :param lease: how long a reservation waits for the task that takes it (claim mode; timedelta or
        seconds, serialised as seconds).
    :param max_deliveries: deliveries of one message before it moves to the error queue (claim mode).
    :param error_queue: error queue; defaults to the connection's, else ``error``.
    :param wake_on_notify: also wake when a sender notifies (``SendMessageOperator(notify=True)``,
        PostgreSQL only); the peek interval remains the fallback.
    """

    def __init__(
        self,
        *,
        sqlqueue_conn_id: str,
        queue_name: str,
        max_messages: int = defaults.SENSOR_BATCH,
        transaction_mode: str = TransactionMode.CLAIM.value,
        peek_interval: float = defaults.PEEK_INTERVAL,
        lease: timedelta | float = defaults.LEASE,
        max_deliveries: int = defaults.MAX_DELIVERIES,
        error_queue: str | None = None,
        wake_on_notify: bool = False,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # BaseTrigger.__init__ has no annotations
        # Checked where the task defers, not later in the triggerer: a bad argument fails the task.
        check_positive("max_messages", max_messages)
        check_positive("max_deliveries", max_deliveries)
        flag("wake_on_notify", wake_on_notify)
        checked_text("sqlqueue_conn_id", sqlqueue_conn_id, limit=defaults.MAX_LABEL)
        checked_text("queue_name", queue_name)
        if error_queue is not None:
            checked_text("error_queue", error_queue)
        peek_interval = duration("peek_interval", peek_interval, maximum=defaults.MAX_PEEK_INTERVAL).total_seconds()
        self.sqlqueue_conn_id = sqlqueue_conn_id
        self.queue_name = queue_name
        self.max_messages = max_messages
        self.transaction_mode = receiving_mode(transaction_mode).value
        self.peek_interval = float(peek_interval)
        self.lease = lease_seconds(lease)
        self.max_deliveries = max_deliveries
        self.error_queue = error_queue
        self.wake_on_notify = bool(wake_on_notify)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "sqlqueue_conn_id": self.sqlqueue_conn_id,
                "queue_name": self.queue_name,
                "max_messages": self.max_messages,
                "transaction_mode": self.transaction_mode,
                "peek_interval": self.peek_interval,
                "lease": self.lease,
                "max_deliveries": self.max_deliveries,
                "error_queue": self.error_queue,
                "wake_on_notify": self.wake_on_notify,
            },
        )

    async def _receive(self, client: AsyncQueueClient) -> list[Any]:
        if self.transaction_mode == TransactionMode.CLAIM.value:
            return await client.reserve(
                self.queue_name,
                self.max_messages,
                lease=self.lease,
                max_deliveries=self.max_deliveries,
                error_queue=self.error_queue,
            )
        return await client.receive(self.queue_name, self.max_messages, error_queue=self.error_queue)

    def _poller(self) -> Poller:
        from ..hooks.sqlqueue import SqlQueueHook
        from ..transport.watch import Poller, shared_poller

        key = (self.sqlqueue_conn_id, self.peek_interval, self.wake_on_notify)  # peeking needs nothing else
        # The poller's clients have the connection's own defaults: any trigger of it borrows them
        # and names its own error queue when it receives.
        return shared_poller(
            key,
            lambda: Poller(
                SqlQueueHook(self.sqlqueue_conn_id).async_client,
                interval=self.peek_interval,
                listen=self.wake_on_notify,
            ),
        )

    async def batches(self) -> AsyncIterator[list[dict[str, Any]]]:
        """Wait until messages are there, receive them, yield them as dicts; forever.

        Errors that retrying can fix (database down, connection killed) are logged and backed off
        from; anything else (missing table, bad connection) propagates. The trigger borrows a
        connection from the shared poller only while receiving: waiting is the poller's.
        """
        await asyncio.to_thread(_import_runtime)
        release = _report_health(self.sqlqueue_conn_id, await asyncio.to_thread(_health_interval))
        try:
            async for batch in self._batches():
                yield batch
        finally:
            release()

    async def _batches(self) -> AsyncIterator[list[dict[str, Any]]]:
        from ..transport.breaker import CircuitBreaker
        from ..transport.errors import TransportUnavailableError
        from ..transport.pump import check_peek_interval

        for warning in check_peek_interval(self.peek_interval):
            self.log.warning("Queue %s: %s", self.queue_name, warning)
        breaker = CircuitBreaker(
            base_delay=min(self.peek_interval, 1.0),
            max_backoff=defaults.MAX_BACKOFF_SECONDS,
            alarm_after=defaults.BREAKER_ALARM_SECONDS,
        )
        self.log.info(
            "Queue %s: waiting for messages (mode=%s, up to %d per event, peek every %.3gs%s)",
            self.queue_name,
            self.transaction_mode,
            self.max_messages,
            self.peek_interval,
            ", woken by NOTIFY" if self.wake_on_notify else "",
        )
        full = False
        while True:
            poller = self._poller()
            if not full:
                await poller.wait(self.queue_name, include_claims=self.transaction_mode == TransactionMode.CLAIM.value)
            try:
                async with poller.client() as client:
                    address = client.canonical_address(self.queue_name)
                    received = await self._receive(client)
                breaker.success()
            except TransportUnavailableError as exc:
                full = False
                await asyncio.sleep(breaker.failure(exc, self.queue_name))
                continue
            full = len(received) == self.max_messages  # more may wait: receive again before waiting
            if not received:
                self.log.debug("Queue %s: woken, but other consumers took the messages", address)
                continue
            self.log.info(
                "Queue %s: %s %d message(s) (ids %s)",
                address,
                "reserved" if self.transaction_mode == TransactionMode.CLAIM.value else "received",
                len(received),
                ", ".join(str(message.id) for message in received),
            )
            yield [message.to_dict(address) for message in received]

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            async for batch in self.batches():
                yield TriggerEvent({"status": "success", "messages": batch})
                return
        except (SqlQueueError, ValueError) as exc:
            self.log.error("Queue %s: cannot wait for messages: %s", self.queue_name, exc)
            yield TriggerEvent({"status": "error", "message": f"{type(exc).__name__}: {exc}"})


class SqlQueueEventTrigger(SqlQueueTrigger, BaseEventTrigger):
    """Fire one event per message, forever: the trigger of an ``AssetWatcher``.

    Each event's payload is the message dict (it becomes the asset event's ``extra["payload"]``).
    In ``claim`` mode the message is reserved, and the run takes it with
    :func:`~airflow_provider_sqlqueue.tasks.hold_messages`: a run takes *every*
    reservation waiting on the queue, not only those of its own events, because Airflow's
    scheduler folds events that arrive together into one run and attaches others to later runs.
    A run that finds its events' messages already taken by an earlier run has nothing to do.
    """

    async def run(self) -> AsyncIterator[TriggerEvent]:
        async for batch in self.batches():
            for message in batch:
                yield TriggerEvent(message)
