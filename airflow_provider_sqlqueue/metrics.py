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
``sqlqueue.due_delayed``    delayed messages already due that no mover has moved (up to 10,000)
``sqlqueue.overdue``        seconds the earliest of them has been due (0 when none is)
``sqlqueue.dead_rows``      dead rows in the queue table that vacuum has yet to remove (PostgreSQL)
``sqlqueue.problems``       problems found with the queue (``sqlqueue health`` lists them)
==========================  =====================================================================

and per connection, tagged ``conn_id`` (PostgreSQL; ``sqlqueue.<name>.<conn_id>`` for plain StatsD):

==============================  =================================================================
``sqlqueue.horizon_age``        seconds the oldest transaction holding the xmin horizon has run
``sqlqueue.horizon_xid_age``    transactions since that snapshot (replication slots too)
``sqlqueue.horizon_problems``   1 when it is held long enough to be a problem, else 0
==============================  =================================================================

Counters, from every client a :class:`~.hooks.sqlqueue.SqlQueueHook` hands out (operators, the
sensor, the triggers, task helpers) and from a ``MessagePump`` given a :class:`StatsMeter`, per
queue, tagged like the gauges: ``sqlqueue.sent``, ``sqlqueue.received``, ``sqlqueue.handled``,
``sqlqueue.failed``, ``sqlqueue.moved_to_error``, ``sqlqueue.retried`` (per error queue),
``sqlqueue.leases_lost``, ``sqlqueue.moved_due`` (see :mod:`.transport.meter`), and the timing
``sqlqueue.handler_duration`` (a pump's handler, in milliseconds).

Each queue figure is sent tagged (``conn_id``, ``schema``, ``queue``) for backends with tags, and, as Airflow
does for pools and DAGs while ``[metrics] legacy_names_on`` is true (its default), once more with the
names in the metric for plain StatsD:
``sqlqueue.waiting.<conn_id>.<schema>.<queue>``, each part escaped (:func:`metric_name_part`:
``a.b`` is ``a-2e-b``) so that no two queues share a metric.
Figures come from indexes and the database's statistics (``QueueClient.health``), so a run costs a
few queries per queue.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import TYPE_CHECKING

from .transport import QueueAddress
from .transport.logs import logger
from .transport.meter import Event, Meter

if TYPE_CHECKING:
    from .transport.client import QueueClient

log = logger("airflow_provider_sqlqueue.metrics")

#: Characters a part of a metric name keeps as they are (Airflow's validator also allows ``-``,
#: which is kept for the escapes).
_KEPT = re.compile(r"[A-Za-z0-9_]+")


def metric_name_part(text: str) -> str:
    """``text`` as one dotted part of a metric name, which Airflow's validator allows letters,
    digits, ``_`` and ``-`` in: letters, digits and ``_`` as they are; ``-`` doubled; any other
    character as ``-``, its code point in hex, ``-`` (``a.b`` is ``a-2e-b``); the empty text as a
    lone ``-``.

    The escaping can be undone, so it is injective: two different names never share a metric,
    whatever they hold (a name that reads like another's escape, ``a-2e-b``, is ``a--2e--b``).
    """
    if not text:
        return "-"
    parts: list[str] = []
    at = 0
    while at < len(text):
        kept = _KEPT.match(text, at)
        if kept is not None:
            parts.append(kept.group())
            at = kept.end()
            continue
        char = text[at]
        parts.append("--" if char == "-" else f"-{ord(char):x}-")
        at += 1
    return "".join(parts)


class StatsMeter(Meter):
    """The events of a client or pump of connection ``conn_id``, sent through Airflow's metrics (``Stats``).

    Airflow's ``[metrics]`` settings apply as to its own metrics: StatsD, Datadog or OpenTelemetry,
    the prefix, allow and block lists; with metrics off each event costs a call that does nothing.
    """

    def __init__(self, conn_id: str) -> None:
        self.conn_id = conn_id
        self.legacy_names = legacy_names_on()

    def count(self, event: Event, queue: QueueAddress, n: int) -> None:
        from airflow.sdk.observability.stats import Stats

        tags, path = _names(self.conn_id, queue)
        Stats.incr(f"sqlqueue.{event}", n, tags=tags)
        if self.legacy_names:
            Stats.incr(f"sqlqueue.{event}.{path}", n)

    def handler_time(self, queue: QueueAddress, seconds: float) -> None:
        from airflow.sdk.observability.stats import Stats

        tags, path = _names(self.conn_id, queue)
        Stats.timing("sqlqueue.handler_duration", timedelta(seconds=seconds), tags=tags)
        if self.legacy_names:
            Stats.timing(f"sqlqueue.handler_duration.{path}", timedelta(seconds=seconds))


def legacy_names_on() -> bool:
    """``[metrics] legacy_names_on``: whether the names with the connection, schema and queue in them
    are sent beside the tagged ones, as Airflow does for its own metrics (default: yes)."""
    from airflow.sdk import conf

    return conf.getboolean("metrics", "legacy_names_on", fallback=True)


def _names(conn_id: str, queue: QueueAddress) -> tuple[dict[str, str], str]:
    """A queue's tags, and its dotted name for plain StatsD: ``<conn_id>.<schema>.<queue>``."""
    schema = queue.schema or ""
    path = ".".join(metric_name_part(part) for part in (conn_id, schema, queue.table))
    return {"conn_id": conn_id, "schema": schema, "queue": queue.table}, path


def emit_queue_metrics(
    conn_ids: Iterable[str], open_client: Callable[[str], AbstractContextManager[QueueClient]]
) -> dict[str, int]:
    """Gauge every queue of each connection; returns how many queues were measured per connection.

    ``open_client(conn_id)`` opens a blocking client on the connection, closed at the end of its
    ``with`` block: the hook's, ``lambda conn_id: SqlQueueHook(conn_id).client()``, from the
    Airflow code that calls this (the hook hands out clients reporting to :class:`StatsMeter`, so
    this module does not import it). A connection that cannot be read is logged and skipped: the
    others are still measured.
    """
    from airflow.sdk.observability.stats import Stats

    legacy = legacy_names_on()
    measured: dict[str, int] = {}
    for conn_id in conn_ids:
        try:
            with open_client(conn_id) as client:
                health = client.health(report_unreadable=True)  # a queue that cannot be measured is a problem
                errors = {s.queue for s in health.queues if client.kind(s.queue) == "error"}
        except Exception:
            log.exception("Queue metrics: could not read the queues of connection %s; skipping it", conn_id)
            continue
        now = health.checked_at
        problems = Counter(p.queue for p in health.problems)
        if health.horizon is not None:
            oldest = health.horizon.oldest
            held = None if oldest is None else oldest.held_for(now)
            for name, value in {
                "horizon_age": 0.0 if held is None else held.total_seconds(),
                "horizon_xid_age": 0 if oldest is None else oldest.xid_age or 0,
                # The horizon's own: a survey that could read no queue is a problem of the database too.
                "horizon_problems": sum(p.concern == "horizon" for p in health.problems),
            }.items():
                Stats.gauge(f"sqlqueue.{name}", value, tags={"conn_id": conn_id})
                if legacy:
                    Stats.gauge(f"sqlqueue.{name}.{metric_name_part(conn_id)}", value)
        for found in health.queues:
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
                "due_delayed": found.due_delayed,
                "overdue": None if found.due_delayed is None else (found.overdue or timedelta(0)).total_seconds(),
                "dead_rows": found.dead_rows,
                "problems": problems[found.queue],
            }
            _gauge(Stats.gauge, conn_id, found.queue, figures, legacy=legacy)
        measured[conn_id] = len(health.queues)
        log.info(
            "Queue metrics: measured %d queue(s) of connection %s; %d problem(s)",
            len(health.queues),
            conn_id,
            len(health.problems),
        )
    return measured


def _gauge(
    gauge: Callable[..., object], conn_id: str, queue: QueueAddress, figures: dict[str, float | None], *, legacy: bool
) -> None:
    tags, path = _names(conn_id, queue)
    for name, value in figures.items():
        if value is None:
            continue
        gauge(f"sqlqueue.{name}", value, tags=tags)
        if legacy:
            gauge(f"sqlqueue.{name}.{path}", value)
