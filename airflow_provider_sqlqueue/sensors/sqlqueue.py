"""Wait for messages on a queue table and hand them to downstream tasks."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue, conf
from airflow.sdk.exceptions import AirflowException

from ..hooks.sqlqueue import SqlQueueHook
from ..lineage import queue_lineage
from ..tasks import as_dicts, claim_holder
from ..transport import TransactionMode, defaults
from ..transport.message import check_positive
from ..triggers.sqlqueue import SqlQueueTrigger, lease_seconds, receiving_mode


class SqlQueueSensor(BaseSensorOperator):
    """Succeed when messages arrive on ``queue_name``; their dicts become this task's XCom return value.

    Pass ``deferrable=True``: the wait then runs in the triggerer
    (:class:`~airflow_provider_sqlqueue.triggers.sqlqueue.SqlQueueTrigger`) and holds no worker
    slot. The default is Airflow's ``[operators] default_deferrable``, which is False unless
    configured, and a poking sensor holds a worker slot and receives only every ``poke_interval``.
    Either way the sensor first tries to receive at once, so a waiting message never costs a
    deferral.

    In ``claim`` mode (default) the messages are this task's claims, with a ``lease`` (2 minutes
    by default) that the task working on them renews
    (:func:`~airflow_provider_sqlqueue.tasks.hold_messages`) until
    :class:`~airflow_provider_sqlqueue.operators.sqlqueue.ForwardMessagesOperator` or
    :class:`~airflow_provider_sqlqueue.operators.sqlqueue.AckMessagesOperator` settles them. While
    deferred, the trigger only reserves what it receives; this task takes the reservations when
    it resumes. If the DAG is paused meanwhile, or the triggerer dies before Airflow stored its
    event, the reservation runs out within one lease and the messages go to other consumers, with
    no delivery counted; the resumed sensor then waits again. A run that fails gives its messages
    back; after ``max_deliveries`` deliveries they move to the error queue.

    Each message dict has ``queue``, ``id``, ``headers``, ``body`` (parsed JSON for JSON content,
    else text, else base64), ``body_encoding``, ``claim_token`` and ``deliveries``.

    :param queue_name: the queue, in the database's address syntax (``orders``, ``orders@"sales"``).
    :param sqlqueue_conn_id: a postgres, mssql, odbc or sqlqueue connection.
    :param max_messages: most messages taken in one go.
    :param transaction_mode: ``claim`` or ``none`` (deleted on receipt: a failed run loses them).
    :param lease: how long claimed messages are reserved (timedelta or seconds).
    :param max_deliveries: deliveries before a message moves to the error queue.
    :param peek_interval: seconds between the trigger's peeks while the queue is empty.
    :param error_queue: error queue; defaults to the connection's, else ``error``.
    :param wake_on_notify: when deferred, also wake at once on a sender's notification
        (``SendMessageOperator(notify=True)``; PostgreSQL); the peek interval stays the fallback.
    :param deferrable: wait in the triggerer instead of a worker slot.
    """

    template_fields: Sequence[str] = ("queue_name", "sqlqueue_conn_id", "error_queue")
    ui_color = "#d8ecf3"

    def __init__(
        self,
        *,
        queue_name: str,
        sqlqueue_conn_id: str = SqlQueueHook.default_conn_name,
        max_messages: int = defaults.SENSOR_BATCH,
        transaction_mode: TransactionMode | str = TransactionMode.CLAIM,
        lease: timedelta | float = defaults.LEASE,
        max_deliveries: int = defaults.MAX_DELIVERIES,
        peek_interval: float = defaults.PEEK_INTERVAL,
        error_queue: str | None = None,
        wake_on_notify: bool = False,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        check_positive("max_messages", max_messages)
        self.queue_name = queue_name
        self.sqlqueue_conn_id = sqlqueue_conn_id
        self.max_messages = max_messages
        self.transaction_mode = receiving_mode(transaction_mode).value
        self.lease = lease_seconds(lease)
        self.max_deliveries = max_deliveries
        self.peek_interval = peek_interval
        self.error_queue = error_queue
        self.wake_on_notify = wake_on_notify
        self.deferrable = deferrable

    @property
    def hook(self) -> SqlQueueHook:
        return SqlQueueHook(self.sqlqueue_conn_id, error_queue=self.error_queue)

    def _receive(self, context: Any) -> list[dict[str, Any]]:
        with self.hook.client() as client:
            if self.transaction_mode == TransactionMode.CLAIM.value:
                received = client.claim(
                    self.queue_name,
                    self.max_messages,
                    lease=self.lease,
                    max_deliveries=self.max_deliveries,
                    holder=claim_holder(context),
                )
            else:
                received = client.receive(self.queue_name, self.max_messages)
            messages = as_dicts(client, self.queue_name, received)
        if messages:
            self.log.info("Queue %s: received %d message(s)", messages[0]["queue"], len(messages))
        return messages

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """The queue table the sensor reads, for the openlineage provider (:mod:`...lineage`)."""
        return queue_lineage(self.hook, [self.queue_name], [])

    def poke(self, context: Any) -> PokeReturnValue:
        messages = self._receive(context)
        return PokeReturnValue(is_done=bool(messages), xcom_value=messages or None)

    def execute(self, context: Any) -> Any:
        if not self.deferrable:
            return super().execute(context)
        messages = self._receive(context)
        if messages:
            return messages
        self._defer()
        return None  # not reached: defer() hands the task to the triggerer

    def _defer(self) -> None:
        self.log.info("Queue %s: empty; deferring to the triggerer", self.queue_name)
        self.defer(
            trigger=SqlQueueTrigger(
                sqlqueue_conn_id=self.sqlqueue_conn_id,
                queue_name=self.queue_name,
                max_messages=self.max_messages,
                transaction_mode=self.transaction_mode,
                peek_interval=self.peek_interval,
                lease=self.lease,
                max_deliveries=self.max_deliveries,
                error_queue=self.error_queue,
                wake_on_notify=self.wake_on_notify,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout) if self.timeout else None,
        )

    def execute_complete(self, context: Any, event: dict[str, Any]) -> list[dict[str, Any]]:
        """Resume after the trigger fired: take its reservations (they become the XCom return value).

        Reservations that ran out meanwhile (a paused DAG, a slow scheduler) may have gone to another
        consumer; if none is left, the sensor waits again.
        """
        if event.get("status") != "success":
            raise AirflowException(f"Queue {self.queue_name}: {event.get('message', event)}")
        messages: list[dict[str, Any]] = event["messages"]
        if self.transaction_mode == TransactionMode.CLAIM.value and messages:
            queue = messages[0]["queue"]
            tokens = [m["claim_token"] for m in messages]
            with self.hook.client() as client:
                taken = client.take(queue, tokens, lease=self.lease, holder=claim_holder(context))
                messages = as_dicts(client, queue, taken)
            self.log.info("Queue %s: took %d of %d reserved message(s)", queue, len(messages), len(event["messages"]))
            if not messages:
                self._defer()
        return messages
