"""Queue metrics through Airflow's own metrics (StatsD, Datadog or OpenTelemetry, as ``[metrics]`` sets).

Per queue of each connection, at the interval of the task that calls :func:`emit_queue_metrics`
(``QueueMetricsOperator``; the example DAG ``sqlqueue_metrics`` runs it every five minutes):

==========================  =====================================================================
``sqlqueue.waiting``        messages waiting (the peek estimate)
``sqlqueue.oldest_age``     seconds since the oldest waiting message was sent (its TimeSent)
``sqlqueue.in_flight``      claims held
``sqlqueue.lapsed``         claims whose lease ran out
``sqlqueue.expired``        expired messages awaiting purge (counted up to 10,000)
``sqlqueue.errors``         messages in each error queue
==========================  =====================================================================

Each is sent tagged (``conn_id``, ``schema``, ``queue``) for backends with tags, and, as Airflow
does for pools and DAGs, once more with the names in the metric for plain StatsD:
``sqlqueue.waiting.<conn_id>.<schema>.<queue>``, characters StatsD does not take replaced by ``_``.
Figures come from indexes (``QueueClient.queue_stats``), so a run costs one query per queue.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from datetime import datetime, timezone

from .hooks.sqlqueue import SqlQueueHook
from .transport import QueueAddress

log = logging.getLogger("airflow_provider_sqlqueue.metrics")

_NOT_IN_A_NAME = re.compile(r"[^A-Za-z0-9_-]")


def metric_name_part(text: str) -> str:
    """``text`` as one dotted part of a metric name (Airflow's validator allows letters, digits, ``_`` and ``-``)."""
    return _NOT_IN_A_NAME.sub("_", text) or "_"


def emit_queue_metrics(conn_ids: Iterable[str]) -> dict[str, int]:
    """Gauge every queue of each connection; returns how many queues were measured per connection.

    A connection that cannot be read is logged and skipped: the others are still measured.
    """
    from airflow.sdk.observability.stats import Stats

    measured: dict[str, int] = {}
    for conn_id in conn_ids:
        hook = SqlQueueHook(conn_id)
        try:
            with hook.client() as client:
                queues = client.queues()
                stats = client.queue_stats(queues)
                errors = {q for q in queues if client.kind(q) == "error"}
        except Exception:
            log.exception("Queue metrics: could not read the queues of connection %s; skipping it", conn_id)
            continue
        now = datetime.now(timezone.utc)
        for found in stats:
            figures: dict[str, float | None] = {
                "waiting": found.waiting,
                # An empty queue's oldest message is 0 s old: sent, not left out, so that an alert on a
                # stuck queue clears when the queue drains (StatsD keeps a gauge's last value).
                "oldest_age": (0.0 if found.waiting == 0 else None)
                if found.oldest_sent is None
                else max(0.0, (now - found.oldest_sent).total_seconds()),
                "in_flight": found.in_flight,
                "lapsed": found.lapsed,
                "expired": found.expired,
                "errors": found.waiting if found.queue in errors else None,
            }
            _gauge(Stats.gauge, conn_id, found.queue, figures)
        measured[conn_id] = len(stats)
        log.info("Queue metrics: measured %d queue(s) of connection %s", len(stats), conn_id)
    return measured


def _gauge(gauge: Callable[..., object], conn_id: str, queue: QueueAddress, figures: dict[str, float | None]) -> None:
    schema = queue.schema or ""
    tags = {"conn_id": conn_id, "schema": schema, "queue": queue.table}
    path = ".".join(metric_name_part(part) for part in (conn_id, schema, queue.table))
    for name, value in figures.items():
        if value is None:
            continue
        gauge(f"sqlqueue.{name}", value, tags=tags)
        gauge(f"sqlqueue.{name}.{path}", value)
