"""Operators around queue tables: install, send, forward, acknowledge, give back, purge, retry.

All of them work through :class:`~airflow_provider_sqlqueue.hooks.sqlqueue.SqlQueueHook`, so they
accept the same connection types and never build SQL. The queue parameter is ``queue_name``
(``queue`` is BaseOperator's executor queue).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime, timedelta
from typing import Any, ClassVar

from airflow.sdk import BaseOperator

from ..hooks.sqlqueue import SqlQueueHook, configured_conn_ids
from ..lineage import queue_lineage
from ..tasks import (
    claimed_messages,
    failure_source,
    received_times,
    sent_in_stage_context,
    settling,
    stage_groups,
    tokens_by_queue,
)
from ..transport import Failure, Message, QueueAddress, defaults
from ..transport.arguments import delay_ms
from ..transport.errors import ArgumentTypeError, InvalidArgumentError, SqlQueueError
from ..transport.message import ENCLOSED_MESSAGE_TYPES, flag, topic_names


class _QueueOperator(BaseOperator):
    """Holds the connection settings every queue operator shares: connection, error queue, audit queue (as the hook takes them)."""

    ui_color = "#d8ecf3"
    #: The queues the task read and wrote, as its execute saw them: its lineage.
    _lineage: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())

    def __init__(
        self,
        *,
        sqlqueue_conn_id: str = SqlQueueHook.default_conn_name,
        error_queue: str | None = None,
        audit_queue: str | bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.sqlqueue_conn_id = sqlqueue_conn_id
        self.error_queue = error_queue
        self.audit_queue = audit_queue

    @property
    def hook(self) -> SqlQueueHook:
        return SqlQueueHook(self.sqlqueue_conn_id, error_queue=self.error_queue, audit_queue=self.audit_queue)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """The queue tables this task read and wrote, for the openlineage provider (:mod:`...lineage`)."""
        return queue_lineage(self.hook, *self._lineage)


class CreateQueueOperator(_QueueOperator):
    """Create a queue table, its error queue and optionally its ``Endpoint.Machine`` secondary queue.

    Idempotent and safe to run concurrently, so it can sit at the start of every DAG that uses the
    queue. Needs the installer's rights (CREATE on the schema). Returns the created addresses.

    :param queue_name: the queue, in the database's address syntax.
    :param error_queue: its error queue (default: the connection's, else ``error``).
    :param secondary: machine name for a secondary queue ``<queue>.<machine>``.
    :param body_string: also add NServiceBus's computed ``BodyString`` column (for reading bodies in SQL tools).
    :param notify_on_insert: make every insert into the queue, whoever makes it (an NServiceBus
        endpoint, plain SQL, Spark), wake the sensors and pumps waiting on it (PostgreSQL).
    :param subscribe_to: event topics (type names) the queue subscribes to, in NServiceBus's
        ``SubscriptionRouting`` table: events published on them (``PublishMessageOperator``, or an
        NServiceBus endpoint) arrive in this queue.
    :param subscription_table: the subscription table (default ``SubscriptionRouting`` in the
        connection's default schema); publishers must use the same one.
    """

    template_fields: Sequence[str] = (
        "queue_name",
        "error_queue",
        "secondary",
        "subscribe_to",
        "subscription_table",
        "sqlqueue_conn_id",
    )

    def __init__(
        self,
        *,
        queue_name: str,
        secondary: str | None = None,
        body_string: bool = False,
        notify_on_insert: bool = False,
        subscribe_to: Sequence[str] = (),
        subscription_table: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.queue_name = queue_name
        self.secondary = secondary
        self.body_string = body_string
        self.notify_on_insert = notify_on_insert
        self.subscribe_to = subscribe_to
        self.subscription_table = subscription_table

    def execute(self, context: Any) -> list[str]:
        hook = self.hook
        # Names and topics are checked before any table is made; the subscription table (shared by
        # every subscriber) is made, or refused when it exists as something else, before the queue.
        topics = topic_names(self.subscribe_to) if self.subscribe_to else []
        with hook.client() as client:
            client.installation(self.queue_name, error_queue=hook.error_queue, secondary=self.secondary)
            if topics:
                client.create_subscription_table(self.subscription_table)
            created = client.create_queue(
                self.queue_name,
                error_queue=hook.error_queue,
                secondary=self.secondary,
                body_string=self.body_string,
                notify_on_insert=self.notify_on_insert,
            )
            names = [client.canonical_address(address) for address in created]
            self._lineage = ((), tuple(names))
            self.log.info("Queue tables ready: %s", ", ".join(names))
            if topics:
                client.subscribe(self.queue_name, topics, table=self.subscription_table)
                self.log.info("Queue %s subscribed to %s", self.queue_name, ", ".join(topics))
        return names


class _SendingOperator(_QueueOperator):
    """Turns bodies into messages the same way for every operator that sends."""

    def __init__(
        self,
        *,
        headers: Mapping[str, str | None] | None = None,
        message_type: str | None = None,
        time_to_be_received: timedelta | float | None = None,
        notify: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.headers = headers
        self.message_type = message_type
        self.time_to_be_received = time_to_be_received
        self.notify = notify

    def _message(self, value: Any) -> Message:
        if isinstance(value, Message):
            return value
        if self.headers is not None and not isinstance(self.headers, Mapping):
            raise ArgumentTypeError(f"headers must map header names to values, got {type(self.headers).__name__}")
        headers = dict(self.headers or {})
        if self.message_type:
            headers.setdefault(ENCLOSED_MESSAGE_TYPES, self.message_type)
        return Message.of(value, headers, self.time_to_be_received)

    def _batch(self, bodies: Any) -> list[Message]:
        if isinstance(bodies, (str, bytes, Mapping)):
            raise ArgumentTypeError(
                f"messages must be a list of bodies, got {type(bodies).__name__}; pass a task's output "
                "(XComArg) rather than a rendered template string, or use body= for a single message"
            )
        return [self._message(value) for value in bodies]


class SendMessageOperator(_SendingOperator):
    """Send one message (``body``) or many (``messages``, e.g. another task's XCom) in one transaction.

    Bodies are serialised by type: bytes as they are, text as UTF-8 ``text/plain``, anything else
    as JSON ``application/json`` (the ``NServiceBus.ContentType`` header says which unless
    ``headers`` sets it). Returns the message ids.

    :param queue_name: destination queue.
    :param body: the body of a single message.
    :param messages: a list of bodies, one message each (give ``body`` or ``messages``).
    :param headers: headers for every message (flat string map, as NServiceBus requires).
    :param message_type: ``NServiceBus.EnclosedMessageTypes``, what an NServiceBus endpoint dispatches on.
    :param time_to_be_received: expiry (timedelta or seconds); expired messages are never delivered.
    :param notify: wake sensors/triggers waiting with ``wake_on_notify`` as the send commits (PostgreSQL
        NOTIFY, one per send however many messages), instead of at their next peek.
    :param delay: deliver no sooner than this long after the send (timedelta or seconds): the
        messages wait in the queue's delayed table (``<queue>.Delayed``) until a pump or
        ``move_due`` -- or the NServiceBus endpoint owning the queue -- moves them in.
    :param due: deliver no sooner than this time (an aware datetime; templated, so
        ``"{{ data_interval_end }}"`` works). Give ``delay`` or ``due``, not both.
    """

    template_fields: Sequence[str] = (
        "queue_name",
        "body",
        "messages",
        "headers",
        "message_type",
        "due",
        "sqlqueue_conn_id",
    )
    template_fields_renderers: ClassVar[dict[str, str]] = {"body": "json", "messages": "json", "headers": "json"}

    def __init__(
        self,
        *,
        queue_name: str,
        body: Any = None,
        messages: Iterable[Any] | None = None,
        delay: timedelta | float | None = None,
        due: datetime | str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.queue_name = queue_name
        if (body is None) == (messages is None):
            raise InvalidArgumentError("give exactly one of body (one message) or messages (a list of bodies)")
        if delay is not None and due is not None:
            raise InvalidArgumentError("give delay or due, not both")
        self.body = body
        self.messages = messages
        self.delay = delay
        self.due = due

    def execute(self, context: Any) -> list[str]:
        batch = [self._message(self.body)] if self.messages is None else self._batch(self.messages)
        try:
            due = datetime.fromisoformat(self.due) if isinstance(self.due, str) else self.due
        except ValueError:
            raise InvalidArgumentError(f"due {str(self.due)[:60]!r} is not an ISO 8601 date and time") from None
        with self.hook.client() as client:
            client.send(self.queue_name, batch, notify=self.notify, delay=self.delay, due=due)
        self._lineage = ((), (self.queue_name,))
        ids = [str(message.id) for message in batch]
        if due is not None or self.delay is not None:
            self.log.info(
                "Queue %s: sent %d message(s), delayed until %s",
                self.queue_name,
                len(ids),
                due or f"{self.delay} from now",
            )
        else:
            self.log.info("Queue %s: sent %d message(s)", self.queue_name, len(ids))
        return ids


class PublishMessageOperator(_SendingOperator):
    """Publish one event (``body``) or many (``messages``) to every queue subscribed to its topics.

    One transaction: every subscriber gets every message, or none does. Each message carries
    ``NServiceBus.MessageIntent: Publish`` and ``NServiceBus.EnclosedMessageTypes`` (the topics,
    unless ``message_type`` or ``headers`` set it). Returns the addresses of the queues reached.

    :param topics: the event's type name, then the types it derives from (subscribers of any of
        them receive it), as NServiceBus publishes.
    :param subscription_table: the subscription table the subscribers used (default
        ``SubscriptionRouting`` in the connection's default schema).
    :param claims: the messages the events came from (what :func:`~airflow_provider_sqlqueue.tasks.hold_messages` yielded): they are
        acknowledged in the publish's transaction, as :class:`ForwardMessagesOperator` does for a
        send, so a stage's result is published once per message.

    ``body``, ``messages``, ``headers``, ``message_type``, ``time_to_be_received`` and ``notify``
    are as for :class:`SendMessageOperator`.
    """

    template_fields: Sequence[str] = (
        "topics",
        "body",
        "messages",
        "headers",
        "message_type",
        "subscription_table",
        "claims",
        "sqlqueue_conn_id",
    )
    template_fields_renderers: ClassVar[dict[str, str]] = {"body": "json", "messages": "json", "headers": "json"}

    def __init__(
        self,
        *,
        topics: str | Sequence[str],
        body: Any = None,
        messages: Iterable[Any] | None = None,
        subscription_table: str | None = None,
        claims: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if (body is None) == (messages is None):
            raise InvalidArgumentError("give exactly one of body (one message) or messages (a list of bodies)")
        self.topics = topics
        self.subscription_table = subscription_table
        self.body = body
        self.messages = messages
        self.claims = claims

    def execute(self, context: Any) -> list[str]:
        batch = [self._message(self.body)] if self.messages is None else self._batch(self.messages)
        claimed = [] if self.claims is None else claimed_messages(self.claims, context)
        claims = tokens_by_queue(claimed)
        groups = stage_groups(claimed, batch)
        with self.hook.client() as client, settling(client, claims, context), _together(client, groups):
            addresses: list[QueueAddress] = []
            for part, events in groups:  # each result published in the trace of the message it came from
                with sent_in_stage_context(", ".join(topic_names(self.topics)), part):
                    addresses += client.publish(
                        self.topics,
                        events,
                        notify=self.notify,
                        table=self.subscription_table,
                        claims=tokens_by_queue(part) or None,
                        started=received_times(part),
                    )
            reached = [client.canonical_address(address) for address in dict.fromkeys(addresses)]
        self._lineage = (tuple(claims), tuple(reached))
        self.log.info(
            "Published %d message(s) on %s to %d queue(s): %s", len(batch), self.topics, len(reached), reached
        )
        return reached


class ForwardMessagesOperator(_SendingOperator):
    """Send a stage's results and acknowledge the claims they came from, in one database transaction.

    Either both happen or neither. If a claim's lease ran out before this runs (the task that did
    the work died, or waited too long to be scheduled), another consumer may have the message and
    will send its own result: nothing is sent or acknowledged and the task fails with
    :class:`~airflow_provider_sqlqueue.transport.errors.LeaseLostError`. So between stages whose
    queues share a database, each message's result is sent exactly once; work outside the
    database (files a Spark job writes) must be idempotent per message id, as it may run twice.
    A failure of the forward itself (not a lost lease) gives the claims back with that error.

    :param queue_name: where the results go.
    :param messages: the results, one message each (a task's output).
    :param claims: the messages they came from (what :func:`~airflow_provider_sqlqueue.tasks.hold_messages` yielded).
    """

    template_fields: Sequence[str] = ("queue_name", "messages", "claims", "headers", "message_type", "sqlqueue_conn_id")
    template_fields_renderers: ClassVar[dict[str, str]] = {"messages": "json", "headers": "json"}

    def __init__(self, *, queue_name: str, messages: Any, claims: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.queue_name = queue_name
        self.messages = messages
        self.claims = claims

    def execute(self, context: Any) -> int:
        claimed = claimed_messages(self.claims, context)
        claims = tokens_by_queue(claimed)
        batch = self._batch(self.messages or [])
        groups = stage_groups(claimed, batch)
        with self.hook.client() as client, settling(client, claims, context), _together(client, groups):
            sent = 0
            for part, results in groups:  # each result sent in the trace of the message it came from
                with sent_in_stage_context(self.queue_name, part):
                    sent += client.forward(
                        tokens_by_queue(part),
                        {self.queue_name: results},
                        notify=self.notify,
                        started=received_times(part),
                    )
        self._lineage = (tuple(claims), (self.queue_name,))
        self.log.info(
            "Queue %s: sent %d result(s) and acknowledged %d claim(s) in one transaction",
            self.queue_name,
            sent,
            sum(map(len, claims.values())),
        )
        return sent


def _together(client: Any, groups: Sequence[object]) -> AbstractContextManager[None]:
    """One transaction around the sends of several groups of results (:func:`~..tasks.stage_groups`):
    all of a stage's results are handed on, and their claims settled, or none."""
    return client.transaction() if len(groups) > 1 else nullcontext()


class AckMessagesOperator(_QueueOperator):
    """Acknowledge claimed messages once the work they started has succeeded.

    Put it last, after the tasks that handle the messages (default trigger rule: all succeeded).
    Returns ``{"acknowledged": n, "expired": m}``: an expired claim's lease ran out before the ack,
    so that message may already have been delivered again (at-least-once); it is logged as a
    warning, and ``fail_on_expired`` turns it into a task failure.

    :param messages: the sensor's output (``sensor.output``); leave None in a DAG started by an
        ``AssetWatcher`` to acknowledge the messages that triggered the run.
    """

    template_fields: Sequence[str] = ("messages", "sqlqueue_conn_id")

    def __init__(self, *, messages: Any = None, fail_on_expired: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.messages = messages
        self.fail_on_expired = fail_on_expired

    def execute(self, context: Any) -> dict[str, int]:
        flag("fail_on_expired", self.fail_on_expired)
        claimed = claimed_messages(self.messages, context)
        grouped = tokens_by_queue(claimed)
        started = received_times(claimed)
        acknowledged = expired = 0
        with self.hook.client() as client:
            acked = {queue: len(client.ack(queue, tokens, started=started)) for queue, tokens in grouped.items()}
        self._lineage = (tuple(grouped), ())
        for queue, tokens in grouped.items():
            held = acked[queue]
            acknowledged += held
            expired += len(tokens) - held
            self.log.info("Queue %s: acknowledged %d of %d claim(s)", queue, held, len(tokens))
        if expired:
            text = f"{expired} claim(s) had expired before the ack; those messages may be delivered again"
            if self.fail_on_expired:
                raise SqlQueueError(text)  # the library's own: some messages may be delivered again
            self.log.warning(text)
        return {"acknowledged": acknowledged, "expired": expired}


class NackMessagesOperator(_QueueOperator):
    """Give claimed messages back at once (after ``delay``) instead of waiting for their leases to run out.

    Typically ``trigger_rule="one_failed"`` after the tasks that handle the messages. Deliveries
    keep counting: after ``max_deliveries`` the next receive moves the message to the error queue.
    Returns how many claims were still held.
    """

    template_fields: Sequence[str] = ("messages", "reason", "sqlqueue_conn_id")

    def __init__(
        self, *, messages: Any = None, delay: timedelta | float = 0, reason: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.messages = messages
        self.delay = delay
        self.reason = reason

    def execute(self, context: Any) -> int:
        delay_ms(self.delay)  # a delay no claim can take fails the task, whatever it holds
        grouped = tokens_by_queue(claimed_messages(self.messages, context))
        reason = Failure.of(
            self.reason or f"a task upstream of {self.task_id} failed in run {context.get('run_id')}",
            failure_source(context),
        )
        given_back = 0
        with self.hook.client() as client:
            returned = {
                queue: len(client.nack(queue, tokens, error=reason, delay=self.delay))
                for queue, tokens in grouped.items()
            }
        self._lineage = (tuple(grouped), ())
        for queue, tokens in grouped.items():
            held = returned[queue]
            given_back += held
            self.log.info("Queue %s: gave back %d of %d claim(s)", queue, held, len(tokens))
        return given_back


class PurgeExpiredMessagesOperator(_QueueOperator):
    """Delete expired messages in bounded batches (each its own short transaction); returns how many."""

    template_fields: Sequence[str] = ("queue_name", "sqlqueue_conn_id")

    def __init__(self, *, queue_name: str, batch_size: int = defaults.PURGE_BATCH, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.queue_name = queue_name
        self.batch_size = batch_size

    def execute(self, context: Any) -> int:
        with self.hook.client() as client:
            purged = client.purge_expired(self.queue_name, self.batch_size)
        self._lineage = ((self.queue_name,), (self.queue_name,))
        self.log.info("Queue %s: purged %d expired message(s)", self.queue_name, purged)
        return purged


class RetryErrorMessagesOperator(_QueueOperator):
    """Send messages from the error queue back to the queue they failed in, without their failure headers.

    :param queue_name: only retry messages that failed in this queue (default: all).
    :param limit: most messages moved per run. Returns how many were moved.
    """

    template_fields: Sequence[str] = ("queue_name", "error_queue", "sqlqueue_conn_id")

    def __init__(self, *, queue_name: str | None = None, limit: int = defaults.RETRY_LIMIT, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.queue_name = queue_name
        self.limit = limit

    def execute(self, context: Any) -> int:
        hook = self.hook
        with hook.client() as client:
            moved = client.retry_errors(hook.error_queue, queue=self.queue_name, limit=self.limit)
        self.log.info(
            "Error queue %s: sent %d message(s) back for retry", hook.error_queue or defaults.ERROR_QUEUE, moved
        )
        return moved


class QueueMetricsOperator(BaseOperator):
    """Send the queues' figures of each connection to Airflow's metrics (see :mod:`airflow_provider_sqlqueue.metrics`).

    Run it on a schedule: the schedule is the metrics' interval. A task cannot list Airflow's
    connections, so they are named: ``conn_ids``, else ``[sqlqueue] connections``, else
    ``sqlqueue_default``. Returns how many queues were measured per connection.
    """

    template_fields: Sequence[str] = ("conn_ids",)

    def __init__(self, *, conn_ids: Sequence[str] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.conn_ids = conn_ids

    def execute(self, context: Any) -> dict[str, int]:
        from ..metrics import emit_queue_metrics

        if self.conn_ids is not None and (
            isinstance(self.conn_ids, (str, bytes, Mapping))
            or not isinstance(self.conn_ids, Iterable)
            or not all(isinstance(conn_id, str) for conn_id in self.conn_ids)
        ):
            raise ArgumentTypeError(f"conn_ids must be a list of connection ids, got {self.conn_ids!r:.100}")
        conn_ids = list(self.conn_ids or configured_conn_ids() or [SqlQueueHook.default_conn_name])
        measured = emit_queue_metrics(conn_ids, lambda conn_id: SqlQueueHook(conn_id).client())
        unread = [conn_id for conn_id in conn_ids if conn_id not in measured]
        if unread:  # the others were measured; the task fails so that the gap is seen
            raise SqlQueueError(f"queue metrics: could not read connection(s) {', '.join(unread)} (see the log)")
        return measured
