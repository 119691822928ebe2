"""Every default of the transport, in one place; the Airflow layer takes its defaults from here too.

The lease is short on purpose. A claim is a promise that its holder is alive and working: a
holder renews it while it works (:class:`~airflow_provider_sqlqueue.transport.lease.LeaseKeeper`,
the pump, the provider's ``hold_messages``), so a long job keeps its messages however long it runs,
and a holder that dies -- a SIGKILLed worker, a triggerer killed between its receive and Airflow
storing the event -- gives them back within one lease instead of after the job's length.
"""

from __future__ import annotations

from datetime import timedelta

#: Name of the error queue; an error queue named without a schema lives in the queue's own schema.
ERROR_QUEUE = "error"

#: How long a claim stays reserved without being renewed (the hand-off lease).
LEASE = timedelta(minutes=2)

#: Deliveries of one message to a handler (or an Airflow task) before it moves to the error queue.
MAX_DELIVERIES = 5

#: Expired messages deleted per transaction by ``purge_expired``.
PURGE_BATCH = 10_000

#: Seconds between peeks of an empty queue (pump, triggers, shared pollers).
PEEK_INTERVAL = 1.0

#: Circuit breaker of every loop (pump, pollers, triggers): longest back-off, and when a lasting
#: outage is logged as an error rather than a warning.
MAX_BACKOFF_SECONDS = 30.0
BREAKER_ALARM_SECONDS = 120.0

#: Most reservations an Airflow run adopts at once (event-driven DAGs).
ADOPT_LIMIT = 100

