"""Queue installation and housekeeping for the example pipelines.

``sqlqueue_setup`` creates every queue of the examples (run it once, with the installer's rights,
before the pipelines); ``sqlqueue_maintenance`` purges expired messages and reports depths,
claims in flight and what sits in the error queue; ``sqlqueue_metrics`` (paused until you
unpause it) sends every queue's figures to Airflow's metrics every five minutes.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG, task
from sqlqueue_stages import QUEUES as NAMES  # example_dags/: the DAGs folder is on sys.path
from sqlqueue_stages import SUBSCRIBERS, SUBSCRIPTIONS, queue

from airflow_provider_sqlqueue.hooks.sqlqueue import SqlQueueHook
from airflow_provider_sqlqueue.operators.sqlqueue import (
    CreateQueueOperator,
    PurgeExpiredMessagesOperator,
    QueueMetricsOperator,
)
from airflow_provider_sqlqueue.transport import QueueNotFoundError

QUEUES = [queue(name) for name in NAMES]
ERROR_QUEUE = queue("error")
START = datetime(2026, 1, 1, tzinfo=UTC)

with DAG(
    "sqlqueue_setup",
    schedule="@once",
    start_date=START,
    catchup=False,
    tags=["sqlqueue"],
):
    for name in NAMES:
        CreateQueueOperator(  # + error@"SCHEMA"; subscribers also subscribe to their events
            task_id=f"create_{name}",
            queue_name=queue(name),
            # Inserts by anyone (the examples' stages, a Spark write, plain SQL, an NServiceBus
            # endpoint) wake the sensors and watchers waiting on the queue at once.
            notify_on_insert=True,
            subscribe_to=SUBSCRIBERS.get(name, ()),
            subscription_table=SUBSCRIPTIONS,
        )

with DAG(
    "sqlqueue_maintenance",
    schedule="@hourly",
    start_date=START,
    catchup=False,
    tags=["sqlqueue"],
    doc_md=__doc__,
):
    purges = [PurgeExpiredMessagesOperator(task_id=f"purge_{name.split('@')[0]}", queue_name=name) for name in QUEUES]

    @task
    def report() -> dict:
        """Depth and in-flight claims per queue, and what sits in the error queue (by source queue and exception)."""
        queues = {}
        with SqlQueueHook(error_queue=ERROR_QUEUE).client() as client:
            for name in QUEUES:
                try:
                    queues[name] = {"waiting": client.depth(name), "in_flight": client.in_flight(name)}
                except QueueNotFoundError:
                    queues[name] = {"missing": True}
            groups = client.error_summary(ERROR_QUEUE)  # the newest 10,000, headers only
        by_source: Counter[str] = Counter()
        by_exception: Counter[str] = Counter()
        for group in groups:
            by_source[group.source] += group.count
            by_exception[group.exception_type] += group.count
        summary = {
            "queues": queues,
            "error_queue": {
                "messages": sum(by_source.values()),
                "by_source": dict(by_source),
                "by_exception": dict(by_exception),
            },
        }
        for name, figures in queues.items():
            print(f"{name}: {figures}")
        print(f"{ERROR_QUEUE}: {summary['error_queue']}")
        return summary

    purges >> report()


with DAG(
    "sqlqueue_metrics",
    schedule=timedelta(minutes=5),  # the metrics' interval
    start_date=START,
    catchup=False,
    is_paused_upon_creation=True,
    tags=["sqlqueue"],
):
    QueueMetricsOperator(task_id="queue_metrics")  # [sqlqueue] connections, else sqlqueue_default
